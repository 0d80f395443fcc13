"""The small records the stage keeps in its state cell."""

from __future__ import annotations


def test_buffer_index_keeps_digests_whole():
    from linstream.pipeline.stage.records import BufferIndex

    index = BufferIndex(None)
    digests = {i: bytes([i] * 15 + [0]) for i in (5, 3, 9)}  # trailing NUL bytes
    for i, d in digests.items():
        index.add(i, d)
    again = BufferIndex(index.pack())
    assert [again.find(i) for i in (3, 5, 9)] == [digests[3], digests[5], digests[9]]
    assert again.find(4) is None and again.run_from(3) == 1


def test_the_stages_event_times_are_beams():
    """The stage counts event time in microseconds without importing Beam: its bounds and its
    idle target are what Beam's timestamps make of them (the DoFn hands it Beam's timer)."""
    from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp
    from linstream.pipeline.stage.records import END_OF_TIME_US, NO_TIMER_US

    assert MIN_TIMESTAMP.micros == NO_TIMER_US and MAX_TIMESTAMP.micros == END_OF_TIME_US
    for ts, idle in ((MIN_TIMESTAMP, 300.0), (Timestamp.of(12.5), 0.1), (Timestamp.of(3), 7)):
        assert ts.micros + int(idle * 1_000_000) == (ts + Duration.of(idle)).micros
