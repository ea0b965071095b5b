/* Who holds the GIL, and in which phase: a benchmark's meter, never part of fxguard.
 *
 * A native thread (it never takes the GIL) reads the interpreter's GIL every few
 * microseconds: whether it is locked and which thread state holds it.  The time
 * between two reads goes to the holder's slot and the phase that slot's thread
 * last named, to "other threads" (a holder that did not register: the autograd
 * worker, a compile thread) or to "free".  Threads register once (the GIL held,
 * through ctypes.PyDLL) and name their phase by writing an int (meter_phase).
 *
 * Reads the GIL's first fields through CPython's internal headers (3.11-3.13);
 * CPython builds with the GIL only.  One meter per process, started and stopped
 * by the benchmark's main thread.  Protection: the sums are written by the
 * sampler alone and read after meter_stop() joins it; each meter_phase slot is
 * written by its own thread; slot_state and meter_slots_used are written under
 * the GIL (meter_register) and read by the sampler without a lock, where a stale
 * read files one interval under "other threads". */
#define Py_BUILD_CORE_MODULE 1
#include <Python.h>
#include "internal/pycore_interp.h"
#if PY_VERSION_HEX < 0x030C0000
#include "internal/pycore_runtime.h"
#endif
#include <pthread.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <time.h>

#define SLOTS 64
#define PHASES 16

/* Written by the sampler, read by the benchmark after meter_stop() (or racily,
 * as counters, while it runs). */
long long meter_held_ns[SLOTS][PHASES];
long long meter_other_ns, meter_free_ns, meter_reads, meter_cpu_ns;
/* Written by each registered thread: the phase it is in. */
volatile int meter_phase[SLOTS];
/* How many threads registered (slots 0..n-1), in order. */
volatile int meter_slots_used;

static uintptr_t slot_state[SLOTS];
static volatile int running;
static pthread_t sampler;
static struct _gil_runtime_state *gil;
static long interval_ns = 5000;

/* The two fields read, without the GIL: a torn or stale read costs one sample. */
#if PY_VERSION_HEX >= 0x030D0000
static int gil_locked(void) { return __atomic_load_n(&gil->locked, __ATOMIC_RELAXED); }
static uintptr_t gil_holder(void) { return (uintptr_t)__atomic_load_n(&gil->last_holder, __ATOMIC_RELAXED); }
#else
static int gil_locked(void) { return __atomic_load_n(&gil->locked._value, __ATOMIC_RELAXED); }
static uintptr_t gil_holder(void) { return __atomic_load_n(&gil->last_holder._value, __ATOMIC_RELAXED); }
#endif

static long long now_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void *sample(void *unused) {
    (void)unused;
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0); /* wake near the asked interval */
    struct timespec nap = {0, interval_ns};
    long long before = now_ns(CLOCK_MONOTONIC);
    while (running) {
        nanosleep(&nap, NULL);
        int locked = gil_locked();
        uintptr_t holder = gil_holder();
        long long now = now_ns(CLOCK_MONOTONIC), spent = now - before;
        before = now;
        meter_reads++;
        if (locked != 1) {
            meter_free_ns += spent;
            continue;
        }
        int slot = -1;
        for (int i = 0; i < meter_slots_used; i++)
            if (slot_state[i] == holder) {
                slot = i;
                break;
            }
        if (slot < 0) {
            meter_other_ns += spent;
            continue;
        }
        int phase = meter_phase[slot];
        meter_held_ns[slot][phase >= 0 && phase < PHASES ? phase : PHASES - 1] += spent;
    }
    meter_cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID);
    return NULL;
}

/* The calling thread's slot (through ctypes.PyDLL: the GIL is held), or -1 when full. */
int meter_register(void) {
    if (meter_slots_used >= SLOTS)
        return -1;
    slot_state[meter_slots_used] = (uintptr_t)PyThreadState_Get();
    meter_phase[meter_slots_used] = PHASES - 1;
    return meter_slots_used++;
}

int meter_start(long nap_ns) {
    if (running)
        return -1;
#if PY_VERSION_HEX >= 0x030C0000
    gil = PyInterpreterState_Main()->ceval.gil;
#else
    gil = &_PyRuntime.ceval.gil;
#endif
    interval_ns = nap_ns > 0 ? nap_ns : interval_ns;
    memset(meter_held_ns, 0, sizeof meter_held_ns);
    meter_other_ns = meter_free_ns = meter_reads = meter_cpu_ns = 0;
    running = 1;
    if (pthread_create(&sampler, NULL, sample, NULL) != 0) {
        running = 0;
        return -1;
    }
    return 0;
}

void meter_stop(void) {
    if (!running)
        return;
    running = 0;
    pthread_join(sampler, NULL);
}
