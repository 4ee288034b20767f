// The in-process CUPTI recorder: latency histograms of the probed CUDA APIs, kept in this
// process's memory by CUPTI Callback API entry/exit callbacks.
//
// Why C and not Python: the callbacks run inside every launch (thousands per step); a Python
// callback would take the GIL each time and cost microseconds. Here a callback costs two clock
// reads and a few atomic adds.
//
// Why the Callback API and not activity records: callbacks can be enabled per function (only the
// launch, synchronize and graph-launch calls), and turned on and off per slice; the runtime
// activity kind records every runtime call (thousands of cudaGetDevice per step).
//
// CUPTI is opened with dlopen at ht_open(), not linked, and its few types are declared here, so
// this file builds on machines without CUDA (tests exercise the histograms with ht_test_record).
//
// The bucket block placeholder below is replaced by the bucket arithmetic of collector/ebpf_program.c (one scheme,
// proto/buckets.py; collector/cupti/native.py does the substitution).
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef uint64_t u64;
typedef uint32_t u32;
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

// --- the CUPTI ABI we use (cupti_callbacks.h, cupti_result.h) ---------------------------------
typedef int CUptiResult;
typedef void *CUpti_SubscriberHandle;
typedef void (*CUpti_CallbackFunc)(void *userdata, int domain, u32 cbid, const void *cbdata);
typedef struct {
    int callbackSite;                 // 0 enter, 1 exit
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    u32 contextUid;
    u64 *correlationData;
    u32 correlationId;
} CUpti_CallbackData;
typedef struct {                      // CUpti_SubscriberParams (cuptiSubscribe_v2)
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;
    size_t oldSubscriberSize;
} HT_SubscriberParams;
#define HT_CUPTI_SUCCESS 0
#define HT_CUPTI_MULTIPLE_SUBSCRIBERS 39
#define HT_DOMAIN_DRIVER 1
#define HT_DOMAIN_RUNTIME 2
#define HT_MAX_CBID 4096

// --- bucket arithmetic ------------------------------------------------------------------------
#define HT_NUM_BUCKETS @NUM_BUCKETS@
#define HT_MIN_EXP @MIN_EXP@
#define HT_MAX_EXP @MAX_EXP@
#define HT_SUB_BITS @SUB_BUCKET_BITS@
@BUCKET_BLOCK@

// --- state ------------------------------------------------------------------------------------
#define HT_MAX_SLOTS 16
#define HT_KIND_LAUNCH 0
#define HT_KIND_SYNC 1
#define HT_KIND_GRAPH 2
#define HT_KIND_MARKER 3              // hypertrace.step(): a boundary, no latency

struct ht_api {                       // one API's calls since the last read
    u64 count, sum_ns, min_ns, max_ns, nested;
    u64 hist[HT_NUM_BUCKETS];
};
struct ht_period {                    // one periodic API's boundaries (not cleared by ht_read)
    u64 last_ns, last_offcpu_ns, last_tid;
    u64 idle_ns;                      // idle time inside this API's intervals, ever
};
// The recent step boundaries (a ring; evhead counts every boundary ever), as the eBPF program
// logs them: Python finds the step as the period of this sequence (collector/steps.py). Here
// the idle counter of an event is its API's (idle_ns above), so it is compared only between
// boundaries of one API, which is what a step's two ends are.
#define HT_EVLOG_LEN 4096
#define HT_GAP_SLOT 0xffffffffULL     // an event that is a gap: no step spans it
// The layout of the eBPF program's boundaries (collector/ebpf.py EVENT_DTYPE); loader_ns and
// io_ns stay 0: callbacks cannot see who woke a thread, nor what it slept in.
struct ht_event { u64 ts_ns, sync_ns, offcpu_ns, loader_ns, io_ns, api; };
static struct ht_event evlog[HT_EVLOG_LEN];
static u64 evhead;
static struct ht_period period[HT_MAX_SLOTS];
struct ht_snapshot {                  // what ht_read hands to Python (layout mirrored there)
    struct ht_api api[HT_MAX_SLOTS];
    u64 callbacks;                    // callbacks run (enter + exit)
    u64 callback_ns;                  // time spent inside them (the recorder's own share)
    u64 sched_reads;                  // reads of a thread's schedstat (priced apart)
    u64 offcpu_ns;                    // blocked off-CPU time outside CUDA calls (all threads)
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct ht_snapshot cur;
static u64 sync_total_ns;             // the process's synchronize time, ever
static u64 offcpu_total_ns;           // the process's blocked time outside CUDA calls, ever

// Threads that made a probed call, for the scheduler evidence Python reads per window
// (/proc/self/task/TID/schedstat): the threads whose waits matter, as the eBPF program's
// "active threads".
#define HT_MAX_THREADS 256
static int tids[HT_MAX_THREADS];
static int ntids;
static __thread int tl_registered;
// Off-CPU time outside CUDA calls, per thread: between a periodic call's exit and the next
// periodic call's entry, the wall time not spent on a CPU nor waiting for one (schedstat's
// run time and run delay) was blocked: waiting on a peer, a queue, I/O. It is what a rank that
// waits for others spends, and what a CPU-starved rank does not.
static __thread int tl_sched_fd = -1;     // -1 not opened yet, -2 unavailable
static __thread u64 tl_exec_ns, tl_runq_ns, tl_wall_ns;
static __thread u64 tl_offcpu_ns;         // this thread's blocked time outside calls, ever
static __thread u64 tl_tid;
static __thread int tl_index = -1;        // this thread's place in tids[] (-1: none)
// The process's idle time, as the eBPF program defines it (every active thread blocked outside
// CUDA calls; here the active threads are those that make synchronize calls), estimated from what callbacks and schedstat can see. A thread's blocked time in
// the gap between two of its periodic calls counts only beyond the time some thread of the
// process spent inside a periodic call meanwhile: a thread blocked while another waits on the
// GPU is waiting for its own process, not for peers. The interval's idle time is then the
// least such time over the threads that closed a gap in it: the process is idle only while
// every one of them is. (A collective run by a pool of worker threads: the workers take turns
// making the step's synchronize call, so the boundary thread's own blocked time reads 0.)
static u64 thr_counted[HT_MAX_THREADS];   // per thread: counted blocked time, ever
static u64 thr_gaps[HT_MAX_THREADS];      // per thread: gaps closed, ever
static u64 base_counted[HT_MAX_SLOTS][HT_MAX_THREADS];   // at each slot's last boundary
static u64 base_gaps[HT_MAX_SLOTS][HT_MAX_THREADS];
// Threads inside a periodic call, per slot (a slot's count is closed out when it is disabled:
// CUPTI reports no exit of a disabled callback, and a lost exit must not read as a thread
// inside a call for ever), and the time with any thread inside one, ever.
static pthread_mutex_t incall_lock = PTHREAD_MUTEX_INITIALIZER;
static u64 incall_slot_n[HT_MAX_SLOTS], incall_slot_gen[HT_MAX_SLOTS];
static u64 incall_n, incall_since_ns, incall_total_ns, incall_last_ns;
static __thread u64 tl_incall_at_exit, tl_in_call_gen;
static __thread int tl_in_call = -1;      // the slot of this thread's open call (-1: none)
// Thread indexes are reused when a thread exits (a process may start threads all its life).
static pthread_key_t idx_key;
static pthread_once_t idx_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t idx_lock = PTHREAD_MUTEX_INITIALIZER;
static int idx_free[HT_MAX_THREADS];
static int nfree;
static int slot_kind[HT_MAX_SLOTS];
static int slot_count;
static signed char rt_slot[HT_MAX_CBID], drv_slot[HT_MAX_CBID];   // cbid -> slot, -1 none
static unsigned char slot_on[HT_MAX_SLOTS];
static volatile u64 slot_gen[HT_MAX_SLOTS];   // bumped when a slot is disabled
static __thread u64 tl_outer_corr, tl_outer_gen;
static __thread int tl_outer_slot = -1;

static void *cupti;
static CUpti_SubscriberHandle sub;
static CUptiResult (*p_subscribe)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
static CUptiResult (*p_subscribe_v2)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *,
                                     HT_SubscriberParams *);
static CUptiResult (*p_unsubscribe)(CUpti_SubscriberHandle);
static CUptiResult (*p_enable)(u32, CUpti_SubscriberHandle, int, u32);
static CUptiResult (*p_name)(int, u32, const char **);
static CUptiResult (*p_result_string)(CUptiResult, const char **);
static char last_error[512];

static __always_inline u64 now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (u64)ts.tv_sec * 1000000000ULL + (u64)ts.tv_nsec;
}

static pthread_key_t fd_key;
static pthread_once_t fd_once = PTHREAD_ONCE_INIT;
static void close_fd(void *v) { close((int)(intptr_t)v - 1); }   // at the thread's exit
static void make_fd_key(void) { pthread_key_create(&fd_key, close_fd); }

static int read_schedstat(u64 *exec_ns, u64 *runq_ns) {
    if (tl_sched_fd == -1) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", (long)syscall(SYS_gettid));
        tl_sched_fd = open(path, O_RDONLY | O_CLOEXEC);
        if (tl_sched_fd < 0) {
            tl_sched_fd = -2;
        } else {
            pthread_once(&fd_once, make_fd_key);
            pthread_setspecific(fd_key, (void *)(intptr_t)(tl_sched_fd + 1));
        }
    }
    if (tl_sched_fd < 0) return -1;
    char buf[96];
    ssize_t n = pread(tl_sched_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    char *end;
    *exec_ns = strtoull(buf, &end, 10);
    *runq_ns = strtoull(end, NULL, 10);
    __atomic_fetch_add(&cur.sched_reads, 1, __ATOMIC_RELAXED);
    return 0;
}

static void release_index(void *v) {             // at the thread's exit
    int i = (int)(intptr_t)v - 1;
    pthread_mutex_lock(&idx_lock);
    tids[i] = 0;
    if (nfree < HT_MAX_THREADS) idx_free[nfree++] = i;
    pthread_mutex_unlock(&idx_lock);
}
static void make_idx_key(void) { pthread_key_create(&idx_key, release_index); }

static void register_thread(void) {
    tl_registered = 1;
    pthread_once(&idx_once, make_idx_key);
    pthread_mutex_lock(&idx_lock);
    int i = nfree ? idx_free[--nfree] : -1;
    if (i < 0 && ntids < HT_MAX_THREADS) i = __atomic_fetch_add(&ntids, 1, __ATOMIC_RELAXED);
    if (i >= 0) tids[i] = (int)syscall(SYS_gettid);
    pthread_mutex_unlock(&idx_lock);
    if (i >= 0) {
        tl_index = i;
        pthread_setspecific(idx_key, (void *)(intptr_t)(i + 1));
    }
}

// (caller holds incall_lock) The time with any thread inside a periodic call, ever, as of
// `now`; `now` is clamped to the latest moment used so far, so the total never goes back when
// two threads' clocks were read in one order and the lock taken in the other.
static u64 incall_total_at(u64 *now) {
    if (*now < incall_last_ns) *now = incall_last_ns;
    incall_last_ns = *now;
    return incall_total_ns + (incall_n ? *now - incall_since_ns : 0);
}

// This thread enters (`slot` >= 0) or leaves (`slot` < 0) a periodic call at `now`; the time
// with any thread inside a call, ever, as of that moment (before an entry counts). A call whose
// count was closed out meanwhile (its slot disabled, or CUPTI unsubscribed) is not counted out
// twice.
static u64 incall_move(int slot, u64 now) {
    pthread_mutex_lock(&incall_lock);
    u64 total = incall_total_at(&now);
    int open = tl_in_call;
    if (open >= 0 && tl_in_call_gen == incall_slot_gen[open] && incall_slot_n[open]) {
        incall_slot_n[open]--;
        if (--incall_n == 0) incall_total_ns += now - incall_since_ns;
    }
    tl_in_call = -1;
    if (slot >= 0) {
        if (incall_n++ == 0) incall_since_ns = now;
        incall_slot_n[slot]++;
        tl_in_call = slot;
        tl_in_call_gen = incall_slot_gen[slot];
    }
    pthread_mutex_unlock(&incall_lock);
    return total;
}

// The time with any thread inside a periodic call, ever, as of `now`.
static u64 incall_now(u64 now) {
    pthread_mutex_lock(&incall_lock);
    u64 t = incall_total_at(&now);
    pthread_mutex_unlock(&incall_lock);
    return t;
}

// Close out `slot`'s open calls (disabled, or all at unsubscribe: `slot` < 0).
static void incall_close_out(int slot) {
    pthread_mutex_lock(&incall_lock);
    u64 now = now_ns();
    incall_total_at(&now);
    for (int s = 0; s < HT_MAX_SLOTS; s++) {
        if (slot >= 0 && s != slot) continue;
        if (incall_slot_n[s]) {
            incall_n -= incall_slot_n[s] < incall_n ? incall_slot_n[s] : incall_n;
            incall_slot_n[s] = 0;
            if (incall_n == 0) incall_total_ns += now - incall_since_ns;
        }
        incall_slot_gen[s]++;
    }
    pthread_mutex_unlock(&incall_lock);
}

// A periodic call of this thread begins (entry) or ends (exit) at `now`.
//   `incall`: the time with any thread inside a periodic call, ever, at `now` (incall_move's);
//   `counted`: whether this gap's blocked time may count (not after a lost exit: the gap holds
//   the lost call's time).
static void periodic_edge(int entry, u64 now, u64 incall, int counted) {
    u64 exec_ns, runq_ns;
    if (read_schedstat(&exec_ns, &runq_ns) != 0) return;
    if (entry && tl_wall_ns) {
        u64 wall = now - tl_wall_ns;
        u64 busy = (exec_ns - tl_exec_ns) + (runq_ns - tl_runq_ns);
        u64 blocked = wall > busy ? wall - busy : 0;
        if (blocked) {
            tl_offcpu_ns += blocked;
            __atomic_fetch_add(&offcpu_total_ns, blocked, __ATOMIC_RELAXED);
        }
        if (tl_index >= 0 && counted) {
            u64 others = incall > tl_incall_at_exit ? incall - tl_incall_at_exit : 0;
            __atomic_fetch_add(&thr_counted[tl_index], blocked > others ? blocked - others : 0,
                               __ATOMIC_RELAXED);
            __atomic_fetch_add(&thr_gaps[tl_index], 1, __ATOMIC_RELAXED);
        }
    }
    if (!entry) {
        tl_exec_ns = exec_ns;
        tl_runq_ns = runq_ns;
        tl_wall_ns = now;
        tl_incall_at_exit = incall;
    }
}

static void log_event(u64 ts, u64 sync, u64 idle, u64 api) {
    struct ht_event *e = &evlog[evhead & (HT_EVLOG_LEN - 1)];
    e->ts_ns = ts;
    e->sync_ns = sync;
    e->offcpu_ns = idle;
    e->loader_ns = 0;
    e->io_ns = 0;
    e->api = api;
    evhead++;
}

// A step boundary of `slot` at `end` (caller holds the lock): its process's idle time since this
// API's previous boundary (the least blocked time, beyond other threads' calls, of the threads
// that closed a gap since: see thr_counted) is added to the API's idle counter, and the
// boundary is logged with it and the synchronize time so far, the waits Python splits a step
// into. A thread that sleeps while another works (a loader, a communication thread) does not
// make the process idle.
static void period_boundary(int slot, u64 end) {
    struct ht_period *p = &period[slot];
    if (!tl_tid) tl_tid = (u64)syscall(SYS_gettid);
    u64 off = tl_offcpu_ns;
    u64 idle = ~0ULL;
    int n = __atomic_load_n(&ntids, __ATOMIC_RELAXED);
    for (int i = 0; i < n && i < HT_MAX_THREADS; i++) {
        u64 g = __atomic_load_n(&thr_gaps[i], __ATOMIC_RELAXED);
        u64 c = __atomic_load_n(&thr_counted[i], __ATOMIC_RELAXED);
        if (g != base_gaps[slot][i] && tids[i] && c - base_counted[slot][i] < idle)
            idle = c - base_counted[slot][i];
        base_gaps[slot][i] = g;
        base_counted[slot][i] = c;
    }
    if (p->last_ns && end > p->last_ns) {
        u64 interval = end - p->last_ns;
        // No thread with an index closed a gap (every index taken): the boundary thread's own
        // blocked time, when the previous boundary was its own too.
        if (idle == ~0ULL)
            idle = p->last_tid == tl_tid && off >= p->last_offcpu_ns ? off - p->last_offcpu_ns : 0;
        p->idle_ns += idle < interval ? idle : interval;
    }
    p->last_ns = end;
    p->last_offcpu_ns = off;
    p->last_tid = tl_tid;
    log_event(end, sync_total_ns, p->idle_ns, (u64)slot);
}

static void record_call(int slot, u64 ns, u64 end) {
    struct ht_api *a = &cur.api[slot];
    u32 b = ht_bucket(ns);
    pthread_mutex_lock(&lock);
    a->count++;
    a->sum_ns += ns;
    if (a->min_ns == 0 || ns < a->min_ns) a->min_ns = ns;
    if (ns > a->max_ns) a->max_ns = ns;
    a->hist[b]++;
    if (slot_kind[slot] == HT_KIND_SYNC) sync_total_ns += ns;
    if (slot_kind[slot] != HT_KIND_LAUNCH) period_boundary(slot, end);
    pthread_mutex_unlock(&lock);
}

static void on_callback(void *userdata, int domain, u32 cbid, const void *data) {
    (void)userdata;
    u64 t0 = now_ns();
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    if (cbid >= HT_MAX_CBID || !cb) return;
    int slot = domain == HT_DOMAIN_RUNTIME ? rt_slot[cbid]
             : domain == HT_DOMAIN_DRIVER ? drv_slot[cbid] : -1;
    if (slot < 0) return;
    if (!tl_registered) register_thread();
    int periodic = slot_kind[slot] != HT_KIND_LAUNCH;
    if (cb->callbackSite == 0) {
        if (periodic && (tl_outer_slot < 0 || slot_gen[tl_outer_slot] != tl_outer_gen)) {
            int lost = tl_in_call >= 0;           // the previous periodic call's exit never came
            periodic_edge(1, t0, incall_move(slot, t0), !lost);
        }
        if (cb->correlationData) *cb->correlationData = t0;
        // The outermost probed call of this thread; a driver call made inside a runtime call is
        // counted once, as the runtime call (nested). An open call whose slot was disabled since
        // its entry may have lost its exit: it no longer counts as open.
        if (tl_outer_slot < 0 || slot_gen[tl_outer_slot] != tl_outer_gen) {
            tl_outer_slot = slot;
            tl_outer_corr = ((u64)domain << 32) | cb->correlationId;
            tl_outer_gen = slot_gen[slot];
        }
    } else {
        u64 corr = ((u64)domain << 32) | cb->correlationId;
        int open = tl_outer_slot >= 0 && slot_gen[tl_outer_slot] == tl_outer_gen;
        if (!open) {
            // Its entry was not seen (the slot was enabled during the call): no duration.
            tl_outer_slot = -1;
            if (tl_in_call >= 0) incall_move(-1, t0);
        } else if (corr != tl_outer_corr) {
            __atomic_fetch_add(&cur.api[tl_outer_slot].nested, 1, __ATOMIC_RELAXED);
        } else {
            if (periodic) periodic_edge(0, t0, incall_move(-1, t0), 1);
            if (cb->correlationData && t0 > *cb->correlationData)
                record_call(slot, t0 - *cb->correlationData, t0);
            tl_outer_slot = -1;
        }
    }
    u64 t1 = now_ns();
    __atomic_fetch_add(&cur.callbacks, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&cur.callback_ns, t1 - t0, __ATOMIC_RELAXED);
}

// --- the API Python calls (collector/cupti/native.py) -------------------------------------------
const char *ht_error(void) { return last_error; }

static const char *result_text(CUptiResult r) {
    const char *s = NULL;
    if (p_result_string && p_result_string(r, &s) == HT_CUPTI_SUCCESS && s) return s;
    return "unknown CUPTI error";
}

// Load libcupti from `path`; 0, or -1 with ht_error() saying why.
int ht_open(const char *path) {
    if (cupti) return 0;
    cupti = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cupti) {
        snprintf(last_error, sizeof last_error, "cannot load %s: %s", path, dlerror());
        return -1;
    }
    p_subscribe = dlsym(cupti, "cuptiSubscribe");
    p_subscribe_v2 = dlsym(cupti, "cuptiSubscribe_v2");
    p_unsubscribe = dlsym(cupti, "cuptiUnsubscribe");
    p_enable = dlsym(cupti, "cuptiEnableCallback");
    p_name = dlsym(cupti, "cuptiGetCallbackName");
    p_result_string = dlsym(cupti, "cuptiGetResultString");
    if (!p_subscribe || !p_unsubscribe || !p_enable || !p_name) {
        snprintf(last_error, sizeof last_error, "%s lacks the Callback API symbols", path);
        dlclose(cupti);
        cupti = NULL;
        return -1;
    }
    return 0;
}

static int strip_eq(const char *cupti_name, const char *want) {
    // CUPTI names carry version and per-thread-stream suffixes: cudaLaunchKernel_v7000,
    // cudaLaunchKernel_ptsz_v7000, cuLaunchKernel_ptsz. Compare the base names.
    size_t n = strlen(want);
    if (strncmp(cupti_name, want, n) != 0) return 0;
    const char *rest = cupti_name + n;
    while (*rest == '_') {
        if (strncmp(rest, "_ptsz", 5) == 0) rest += 5;
        else if (rest[1] == 'v' && rest[2] >= '0' && rest[2] <= '9') {
            rest += 2;
            while (*rest >= '0' && *rest <= '9') rest++;
        } else return 0;
    }
    return *rest == 0;
}

// Map API `name` (kind: 0 launch, 1 sync, 2 graph) to the next slot; returns the slot, or -1.
// Every runtime and driver callback id whose base name matches is routed to it.
static char slot_name[HT_MAX_SLOTS][64];
static int slot_found[HT_MAX_SLOTS];

int ht_add_api(const char *name, int kind) {
    if (slot_count == 0) {
        memset(rt_slot, -1, sizeof rt_slot);
        memset(drv_slot, -1, sizeof drv_slot);
    }
    // The library lives as long as the process: a backend started again maps the same names
    // to the slots it had.
    for (int s = 0; s < slot_count; s++)
        if (strncmp(slot_name[s], name, sizeof slot_name[s] - 1) == 0)
            return slot_found[s] ? s : -2;
    if (slot_count >= HT_MAX_SLOTS) return -1;
    int slot = slot_count++;
    slot_kind[slot] = kind;
    snprintf(slot_name[slot], sizeof slot_name[slot], "%s", name);
    slot_found[slot] = 1;
    if (!p_name || kind == HT_KIND_MARKER) return slot;   // recorded by hand, not by CUPTI
    int found = 0;
    for (u32 cbid = 1; cbid < HT_MAX_CBID; cbid++) {
        const char *s = NULL;
        if (p_name(HT_DOMAIN_RUNTIME, cbid, &s) == HT_CUPTI_SUCCESS && s && strip_eq(s, name)) {
            rt_slot[cbid] = (signed char)slot;
            found++;
        }
        s = NULL;
        if (p_name(HT_DOMAIN_DRIVER, cbid, &s) == HT_CUPTI_SUCCESS && s && strip_eq(s, name)) {
            drv_slot[cbid] = (signed char)slot;
            found++;
        }
    }
    slot_found[slot] = found > 0;
    return found ? slot : -2;                 // -2: CUPTI knows no such function
}

// Subscribe. 0; 1 when another CUPTI subscriber holds it (its name in `holder`); -1 otherwise.
int ht_subscribe(const char *as_name, char *holder, size_t holder_len) {
    if (!cupti) { snprintf(last_error, sizeof last_error, "CUPTI is not loaded"); return -1; }
    if (sub) return 0;
    CUptiResult r;
    if (holder && holder_len) holder[0] = 0;
    if (p_subscribe_v2) {
        HT_SubscriberParams prm;
        memset(&prm, 0, sizeof prm);
        prm.structSize = sizeof prm;
        prm.subscriberName = as_name;
        prm.oldSubscriberName = holder;
        prm.oldSubscriberSize = holder_len;
        r = p_subscribe_v2(&sub, (CUpti_CallbackFunc)on_callback, NULL, &prm);
    } else {
        r = p_subscribe(&sub, (CUpti_CallbackFunc)on_callback, NULL);
    }
    if (r == HT_CUPTI_SUCCESS) return 0;
    sub = NULL;
    snprintf(last_error, sizeof last_error, "cuptiSubscribe: %s (%d)", result_text(r), r);
    return r == HT_CUPTI_MULTIPLE_SUBSCRIBERS ? 1 : -1;
}

// Turn the callbacks of `slot` on or off; 0 or -1.
int ht_enable(int slot, int on) {
    if (slot < 0 || slot >= slot_count) return -1;
    if (!sub) { slot_on[slot] = 0; return on ? -1 : 0; }
    int bad = 0;
    for (u32 cbid = 1; cbid < HT_MAX_CBID; cbid++) {
        if (rt_slot[cbid] == slot && p_enable(on, sub, HT_DOMAIN_RUNTIME, cbid) != HT_CUPTI_SUCCESS)
            bad++;
        if (drv_slot[cbid] == slot && p_enable(on, sub, HT_DOMAIN_DRIVER, cbid) != HT_CUPTI_SUCCESS)
            bad++;
    }
    slot_on[slot] = on && !bad;
    if (!on) {
        __atomic_fetch_add(&slot_gen[slot], 1, __ATOMIC_RELAXED);
        incall_close_out(slot);
    }
    if (bad) snprintf(last_error, sizeof last_error, "cuptiEnableCallback failed for %d ids", bad);
    return bad ? -1 : 0;
}

// Disable everything and unsubscribe (so that another tool can subscribe).
void ht_unsubscribe(void) {
    if (!sub) return;
    for (int s = 0; s < slot_count; s++) ht_enable(s, 0);
    p_unsubscribe(sub);
    sub = NULL;
    incall_close_out(-1);                     // calls open now never report their exits
}

int ht_subscribed(void) { return sub != NULL; }

// Copy the counts since the last read into `out` and clear them (period boundaries stay).
void ht_read(struct ht_snapshot *out) {
    pthread_mutex_lock(&lock);
    u64 cbs = __atomic_exchange_n(&cur.callbacks, 0, __ATOMIC_RELAXED);
    u64 cbns = __atomic_exchange_n(&cur.callback_ns, 0, __ATOMIC_RELAXED);
    u64 reads = __atomic_exchange_n(&cur.sched_reads, 0, __ATOMIC_RELAXED);
    static u64 offcpu_read;
    u64 off = __atomic_load_n(&offcpu_total_ns, __ATOMIC_RELAXED);
    memcpy(out, &cur, sizeof cur);
    out->callbacks = cbs;
    out->callback_ns = cbns;
    out->sched_reads = reads;
    out->offcpu_ns = off - offcpu_read;
    offcpu_read = off;
    memset(cur.api, 0, sizeof cur.api);
    pthread_mutex_unlock(&lock);
}

// Copy the boundaries logged since `since` (at most `max`, the newest) into `out`; returns how
// many, and sets *head to the log's head (the count of boundaries ever). Boundaries older than
// the ring are gone: head - since - returned of them.
int ht_events(struct ht_event *out, int max, u64 since, u64 *head) {
    pthread_mutex_lock(&lock);
    u64 h = evhead;
    u64 from = since < h ? since : h;
    if (h - from > HT_EVLOG_LEN) from = h - HT_EVLOG_LEN;
    if (h - from > (u64)max) from = h - (u64)max;
    int n = 0;
    for (u64 i = from; i < h; i++) out[n++] = evlog[i & (HT_EVLOG_LEN - 1)];
    *head = h;
    pthread_mutex_unlock(&lock);
    return n;
}

// Forget the step boundaries (after a pause: the gap is not a step, so the log says so).
void ht_reset_periods(void) {
    pthread_mutex_lock(&lock);
    for (int s = 0; s < HT_MAX_SLOTS; s++) period[s].last_ns = 0;
    log_event(now_ns(), sync_total_ns, 0, HT_GAP_SLOT);
    pthread_mutex_unlock(&lock);
}

// The threads that made a probed call (at most `max`); their count.
int ht_threads(int *out, int max) {
    int n = __atomic_load_n(&ntids, __ATOMIC_RELAXED);
    if (n > HT_MAX_THREADS) n = HT_MAX_THREADS;
    int k = 0;
    for (int i = 0; i < n && k < max; i++)
        if (tids[i]) out[k++] = tids[i];      // 0: forgotten (or still being written)
    return k;
}

// The calling thread made probed calls that are not the workload's (the calibration): it is
// left out of the threads whose scheduling is reported.
void ht_forget_thread(void) {
    int me = (int)syscall(SYS_gettid);
    int n = __atomic_load_n(&ntids, __ATOMIC_RELAXED);
    for (int i = 0; i < n && i < HT_MAX_THREADS; i++)
        if (tids[i] == me) tids[i] = 0;
    tl_registered = 1;
}

// The cost of one schedstat read on this thread, in ns (averaged over n reads); 0 if none.
double ht_time_sched_reads(int n) {
    u64 e, r, t0 = now_ns();
    int ok = 0;
    for (int i = 0; i < n; i++) ok += read_schedstat(&e, &r) == 0;
    __atomic_fetch_sub(&cur.sched_reads, (u64)ok, __ATOMIC_RELAXED);
    return ok ? (double)(now_ns() - t0) / ok : 0.0;
}

// The calibration's timed loop: `n` calls of an `int fn(int *)` (cudaGetDevice), ns per call.
// In C so that no interpreter work, and no wait for the interpreter's lock, is timed.
double ht_time_calls(void *fn, int n) {
    int (*call)(int *) = (int (*)(int *))fn;
    int dev = 0;
    if (!call || n <= 0) return 0.0;
    u64 t0 = now_ns();
    for (int i = 0; i < n; i++) call(&dev);
    return (double)(now_ns() - t0) / n;
}

// For tests: a periodic call's entry or exit on this thread at `now_ns`.
void ht_test_edge(int entry, u64 now) { periodic_edge(entry, now, incall_now(now), 1); }

size_t ht_snapshot_size(void) { return sizeof(struct ht_snapshot); }
size_t ht_event_size(void) { return sizeof(struct ht_event); }
int ht_max_slots(void) { return HT_MAX_SLOTS; }
int ht_num_buckets(void) { return HT_NUM_BUCKETS; }

// hypertrace.step() in this process: a step boundary of the marker `slot` now.
void ht_mark(int slot) {
    if (slot < 0 || slot >= slot_count || slot_kind[slot] != HT_KIND_MARKER) return;
    u64 now = now_ns();
    if (!tl_registered) register_thread();
    int lost = tl_in_call >= 0;               // a periodic call's exit never came
    u64 incall = lost ? incall_move(-1, now) : incall_now(now);
    periodic_edge(1, now, incall, !lost);     // blocked time since the last boundary
    periodic_edge(0, now, incall, 1);
    pthread_mutex_lock(&lock);
    period_boundary(slot, now);
    pthread_mutex_unlock(&lock);
}

// For tests on machines without CUDA: record one call of `ns` ending at `end_ns`, as a callback
// pair would.
void ht_test_record(int slot, u64 ns, u64 end_ns) {
    if (slot >= 0 && slot < slot_count) record_call(slot, ns, end_ns);
}
