// cuda_emu.h: CUDA kernel sources compiled as C++20 and run on the CPU, every thread of a block
// a fiber, every block of the grid in turn (tests only; see cuda_emu.py).
//
// What it defines: threadIdx / blockIdx / blockDim / gridDim, __global__ / __device__ /
// __forceinline__ / __launch_bounds__ / __restrict__ / __align__, dynamic shared memory
// (`extern __shared__ ... smem_raw[]`, the one name the kernels use), __syncthreads(), atomicMin
// and atomicAdd on int, __uint_as_float, and CUDA's min / max on integers; the math functions are
// the C library's (expf, exp, isfinite, ...), which agree with CUDA's to a few ulp.
//
// How a launch runs: its blocks one after the other, in the schedule's order (forward, reverse,
// or a seeded shuffle), so that a block reading what another writes sees an order CUDA does not
// promise; in each block, its threads as fibers on one OS thread.  Each fiber runs until its
// next __syncthreads() or its end, then the next one runs, in the schedule's order again (a
// shuffle is drawn anew at every barrier).  So the code between two barriers runs thread after
// thread, never interleaved: with forward and reverse orders every pair of threads runs in both
// orders, and a read that lacks a barrier after another thread's write sees the old value under
// one of them.  A barrier that some threads reach while others have exited, or threads waiting
// at different barriers, stop the launch with an error (undefined behaviour in CUDA).  Dynamic
// shared memory is filled with 0xFF bytes (NaN as float or double) before each block, and the
// bytes past the launch's `shared_mem` are a guard: a kernel that writes there fails the launch;
// one that reads there reads NaN.
//
// What it cannot show: anything about warps (no lockstep, no warp-synchronous code, no
// divergence cost), timing, memory coalescing or bank conflicts, register pressure, and races
// inside one barrier interval that need two threads to interleave mid-statement (read-modify-
// write of one location by two threads without an atomic runs correctly here), or between
// blocks running at the same time.  Warp shuffles, static __shared__ arrays and float atomics
// are not provided: a source using them does not build here.
#pragma once

// Few and C headers only: the whole build is a second or two, most of it these.
#undef _FORTIFY_SOURCE  // its longjmp check refuses jumps between the fibers' stacks
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <type_traits>
#include <utility>

// The math the kernels use, from the C library (CUDA's agree to a few ulp), with CUDA's float
// overloads of the double names.
extern "C" {
float expf(float) noexcept;
double exp(double) noexcept;
float logf(float) noexcept;
double log(double) noexcept;
float sqrtf(float) noexcept;
double sqrt(double) noexcept;
float fabsf(float) noexcept;
double fabs(double) noexcept;
float fminf(float, float) noexcept;
float fmaxf(float, float) noexcept;
double fmin(double, double) noexcept;
double fmax(double, double) noexcept;
}
inline float exp(float x) { return expf(x); }
inline float log(float x) { return logf(x); }
inline float sqrt(float x) { return sqrtf(x); }
inline float fabs(float x) { return fabsf(x); }
inline bool isfinite(float x) { return __builtin_isfinite(x); }
inline bool isfinite(double x) { return __builtin_isfinite(x); }
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isnan(double x) { return __builtin_isnan(x); }

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x, y, z;
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

#ifndef EMU_SMEM_BYTES
#define EMU_SMEM_BYTES (256 * 1024)  // more than any device's opt-in maximum (227 KiB)
#endif
#define EMU_SMEM_GUARD (64 * 1024)
#ifndef EMU_STACK_BYTES
#define EMU_STACK_BYTES (256 * 1024)
#endif

alignas(128) unsigned char smem_raw[EMU_SMEM_BYTES + EMU_SMEM_GUARD];

inline float __uint_as_float(unsigned int u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    memcpy(&u, &f, sizeof u);
    return u;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
// fibers never preempt each other, so a plain read-modify-write is atomic here
inline int atomicMin(int* a, int v) {
    const int old = *a;
    if (v < old) *a = v;
    return old;
}
inline int atomicAdd(int* a, int v) {
    const int old = *a;
    *a = old + v;
    return old;
}

namespace emu {

enum State { READY, AT_BARRIER, DONE };

// A fiber is started with makecontext/swapcontext (its own stack) and switched with
// _setjmp/_longjmp afterwards: no signal-mask system call per switch (swapcontext makes two).
struct Fiber {
    ucontext_t ctx;
    jmp_buf jb;
    bool started;
    char* stack;
    uint3 idx;
    State state;
    int line;
};

struct Launch {
    Fiber* fibers = nullptr;
    int n = 0;
    int* order = nullptr;
    ucontext_t sched;
    jmp_buf sched_jb;
    int current = 0;
    void (*body)(void*) = nullptr;
    void* body_arg = nullptr;
};

inline thread_local Launch* L = nullptr;
inline thread_local char last_error[512];

inline void syncthreads(int line) {
    Fiber& f = L->fibers[L->current];
    f.state = AT_BARRIER;
    f.line = line;
    if (!_setjmp(f.jb)) _longjmp(L->sched_jb, 1);
}

inline void trampoline(int i) {
    L->body(L->body_arg);
    L->fibers[i].state = DONE;
    _longjmp(L->sched_jb, 1);  // never returns: the fiber's stack is reused next block
}

inline unsigned long long splitmix(unsigned long long& x) {
    unsigned long long z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The order in which the fibers run until their next barrier: forward, reverse or shuffled.
inline void draw_order(int schedule, unsigned long long block_no, int epoch) {
    const int n = L->n;
    for (int i = 0; i < n; ++i) L->order[i] = schedule == 1 ? n - 1 - i : i;
    if (schedule >= 2) {
        unsigned long long x = (unsigned long long)schedule * 1000003ull + block_no * 7919ull +
                               (unsigned long long)epoch;
        for (int i = n - 1; i > 0; --i) {  // Fisher-Yates
            const int j = (int)(splitmix(x) % (unsigned long long)(i + 1));
            const int t = L->order[i];
            L->order[i] = L->order[j];
            L->order[j] = t;
        }
    }
}

// Run one block (blockIdx set); false with last_error set on a failure.
inline bool run_block(int schedule, unsigned long long block_no) {
    const int n = L->n;
    for (int i = 0; i < n; ++i) {
        Fiber& f = L->fibers[i];
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = EMU_STACK_BYTES;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, reinterpret_cast<void (*)()>(&trampoline), 1, i);
        f.started = false;
        f.state = READY;
        f.line = 0;
    }
    for (int epoch = 0;; ++epoch) {
        draw_order(schedule, block_no, epoch);
        for (int k = 0; k < n; ++k) {
            const int i = L->order[k];
            Fiber& f = L->fibers[i];
            if (f.state != READY) continue;
            L->current = i;
            threadIdx = f.idx;
            if (!_setjmp(L->sched_jb)) {
                if (f.started) _longjmp(f.jb, 1);
                f.started = true;
                swapcontext(&L->sched, &f.ctx);  // returns only by the _longjmp above
            }
        }
        int waiting = 0, done = 0, first = -1;
        for (int i = 0; i < n; ++i) {
            if (L->fibers[i].state == AT_BARRIER) {
                ++waiting;
                if (first < 0) first = i;
            } else {
                ++done;
            }
        }
        if (waiting == 0) return true;
        if (done > 0) {
            snprintf(last_error, sizeof last_error,
                     "block (%u, %u, %u): __syncthreads() at line %d reached by %d threads "
                     "while %d had exited (a barrier in divergent code)",
                     blockIdx.x, blockIdx.y, blockIdx.z, L->fibers[first].line, waiting, done);
            return false;
        }
        for (int i = 0; i < n; ++i) {
            if (L->fibers[i].line != L->fibers[first].line) {
                snprintf(last_error, sizeof last_error,
                         "block (%u, %u, %u): threads wait at different __syncthreads() (line "
                         "%d for thread %d, line %d for thread %d)",
                         blockIdx.x, blockIdx.y, blockIdx.z, L->fibers[first].line, first,
                         L->fibers[i].line, i);
                return false;
            }
        }
        for (int i = 0; i < n; ++i) L->fibers[i].state = READY;
    }
}

// The kernel's parameter types as codes ("*f" const float*, "*fw" float*, "q" long long, ...),
// for cuda_emu.py.
template <class T>
constexpr char scalar_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, float>) return 'f';
    else if constexpr (std::is_same_v<U, double>) return 'd';
    else if constexpr (std::is_same_v<U, int>) return 'i';
    else if constexpr (std::is_same_v<U, unsigned int>) return 'I';
    else if constexpr (std::is_same_v<U, long long>) return 'q';
    else if constexpr (std::is_same_v<U, unsigned long long>) return 'Q';
    else if constexpr (std::is_same_v<U, unsigned short>) return 'H';
    else if constexpr (std::is_same_v<U, unsigned char>) return 'B';
    else return '?';
}

template <class T>
void append_code(char* s) {
    size_t n = strlen(s);
    if (n) s[n++] = ',';
    if constexpr (std::is_pointer_v<T>) {
        s[n++] = '*';
        s[n++] = scalar_code<std::remove_pointer_t<T>>();
        if (!std::is_const_v<std::remove_pointer_t<T>>) s[n++] = 'w';  // the kernel may write
    } else {
        s[n++] = scalar_code<T>();
    }
    s[n] = 0;
}

template <class... A>
const char* signature(void (*)(A...)) {
    static char s[5 * sizeof...(A) + 1];
    if (!s[0]) (append_code<A>(s), ...);
    return s;
}

template <class... A, size_t... I>
void call_with(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <class... A>
struct Body {
    void (*kernel)(A...);
    void** args;
    static void run(void* self) {
        auto* b = static_cast<Body*>(self);
        call_with(b->kernel, b->args, std::index_sequence_for<A...>{});
    }
};

// grid, block: 3 unsigned each; schedule: 0 forward, 1 reverse, >= 2 seeded shuffles.
// Returns 0, or -1 with the reason in last_error.
template <class... A>
int launch(void (*kernel)(A...), const unsigned* grid, const unsigned* block,
           unsigned long long shared_mem, int schedule, void** args) {
    if (shared_mem > EMU_SMEM_BYTES) {
        snprintf(last_error, sizeof last_error, "shared_mem %llu exceeds the emulator's %d bytes",
                 shared_mem, EMU_SMEM_BYTES);
        return -1;
    }
    Launch state;
    Launch* outer = L;
    L = &state;
    Body<A...> body{kernel, args};
    L->body = &Body<A...>::run;
    L->body_arg = &body;
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{block[0], block[1], block[2]};
    L->n = (int)(block[0] * block[1] * block[2]);
    L->fibers = new Fiber[L->n];
    L->order = new int[L->n];
    int t = 0;
    for (unsigned z = 0; z < block[2]; ++z)
        for (unsigned y = 0; y < block[1]; ++y)
            for (unsigned x = 0; x < block[0]; ++x, ++t) {
                L->fibers[t].idx = uint3{x, y, z};
                L->fibers[t].stack = static_cast<char*>(malloc(EMU_STACK_BYTES));
            }
    // blocks in the schedule's order too (forward, reverse, shuffled): a block that reads what
    // another writes depends on an order CUDA does not promise
    const unsigned long long nblocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    unsigned long long* border = new unsigned long long[nblocks];
    for (unsigned long long b = 0; b < nblocks; ++b)
        border[b] = schedule == 1 ? nblocks - 1 - b : b;
    if (schedule >= 2) {
        unsigned long long x = (unsigned long long)schedule * 0x2545F4914F6CDD1Dull;
        for (unsigned long long b = nblocks - 1; b > 0; --b) {
            const unsigned long long j = splitmix(x) % (b + 1);
            const unsigned long long t = border[b];
            border[b] = border[j];
            border[j] = t;
        }
    }
    int rc = 0;
    for (unsigned long long k = 0; k < nblocks && rc == 0; ++k) {
        const unsigned long long block_no = border[k];
        const unsigned bx = (unsigned)(block_no % grid[0]);
        const unsigned by = (unsigned)(block_no / grid[0] % grid[1]);
        const unsigned bz = (unsigned)(block_no / grid[0] / grid[1]);
        blockIdx = uint3{bx, by, bz};
        memset(smem_raw, 0xFF, sizeof smem_raw);
        if (!run_block(schedule, block_no)) {
            rc = -1;
            break;
        }
        for (size_t i = shared_mem; i < sizeof smem_raw; ++i) {
            if (smem_raw[i] != 0xFF) {
                snprintf(last_error, sizeof last_error,
                         "block (%u, %u, %u): wrote shared memory at byte %zu, past the "
                         "launch's shared_mem of %llu bytes",
                         bx, by, bz, i, shared_mem);
                rc = -1;
                break;
            }
        }
    }
    delete[] border;
    for (int i = 0; i < L->n; ++i) free(L->fibers[i].stack);
    delete[] L->fibers;
    delete[] L->order;
    L = outer;
    return rc;
}

}  // namespace emu

#define __syncthreads() emu::syncthreads(__LINE__)

extern "C" const char* emu_last_error() { return emu::last_error; }
