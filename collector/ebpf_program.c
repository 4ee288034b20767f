// hypertrace BPF program (bcc): latency histograms of probed CUDA API calls, kept in the kernel.
//
// Loaded once per agent and kept loaded: attaching/detaching the uprobes (duty cycling) never
// recompiles. collector/ebpf.py fills the HT_* constants from proto/buckets.py and
// collector/apis.py and appends one entry/return function pair per probed API slot.
//
// Why this shape:
//  * No per-event output: every call only updates a per-CPU histogram of its (tgid, api), so the
//    hot path is a few map operations and user space reads the maps once per window.
//  * Nesting: cudaLaunchKernel calls cuLaunchKernel inside. A per-thread record holds the outermost
//    probed call and a depth; inner probed calls only bump the depth (and the outer call's
//    "nested" counter, so the governor still knows what the probes cost). Each launch is counted
//    once, as the API the application called.
//  * Double buffering: records go to stats0 or stats1 as selected by ctl[HT_CTL_BUF]; user space
//    flips the selector, then reads and clears the idle map, so no call is lost or counted twice
//    across the read.
//  * Generation: ctl[HT_CTL_GEN] is bumped by user space on every detach. A thread record from an
//    older generation may have lost its return probe (detached mid-call), so it is treated as
//    absent rather than as an enclosing call forever. (An attach needs no bump: a return whose
//    entry was not seen finds no record and is ignored.)
//  * Step boundaries (periodic kinds: sync, graph launch, the step marker; the flags are compiled
//    into each slot's functions, so launch calls pay nothing for them): every return of an
//    outermost periodic call (the entry, for the entry-only marker) is appended to its
//    process's ring of recent boundaries, with the process's cumulative sync time and idle
//    time at that moment. User space reads the ring once per window and finds the step as the
//    period of that sequence (collector/steps.py): a loop may synchronize several times per
//    step, with irregular spacing, which no single API's intervals can tell from noise. The
//    ring's head counts every boundary ever, so user space knows what it missed. A process's
//    boundaries are its synchronize returns, one CPU at a time in practice; a rare race of two
//    threads overwrites one slot.
//  * Scheduler evidence (sched_switch / sched_waking / sched_wakeup_new): accounted only for
//    "active" threads (threads of a tracked tgid that made a probed call), found by one lookup of
//    the switching thread's id, so every other context switch on the machine costs one miss.
//    Per thread, run-queue latency = runnable (woken, or preempted) -> switched in (a histogram).
//    Per process, the active threads' states are counted (running, queued, blocked inside a
//    probed call, blocked outside) and the time between two state changes is charged to the
//    process as a whole: "starved" while some active thread is runnable and none runs (CPU
//    contention: another process holds the CPUs), "idle" while every active thread is blocked
//    outside CUDA calls (waiting for peers at a CPU-side collective, for I/O, for data). Why the
//    process and not the sum over threads: a training process's threads hand work to each other
//    (the autograd thread runs backward while the main thread blocks on it); summed per thread,
//    that hand-off reads as waiting, and a process pinned to one core reads as contended by its
//    own threads. Counts are updated with atomic adds; the time charged between two changes on
//    different CPUs of one process may be attributed to the state before or after a concurrent
//    change (a few microseconds), which is far below what the signals resolve.
//  * Loader waits: each stretch of idle time is handed, when it ends, to whoever ended it
//    (sched_waking runs in the waker's context): a loader worker of the rank (a child process
//    user space lists in `loaders`), or a thread of the rank that was itself last woken by one
//    (a pin-memory thread; user space lists the rank's threads in `members`, each with the
//    origin of its last wake-up). That part is loader_ns; the rest of the idle time is waiting
//    for peers or anything else. A rank that waits for its own input pipeline is then not read
//    as waiting for its peers (the opposite of the truth: the others wait for it).
//  * Own I/O waits: idle time while an active thread sleeps uninterruptibly (prev_state D: a
//    disk read, a page fault on a mapped file, an NFS or FUSE request) is io_ns, the rank's own
//    wait, never a loader's or a peer's. A rank that loads its data itself (num_workers=0) and
//    blocks on storage is then not read as waiting for its peers. Sleeps, futexes and sockets
//    (S) stay with whoever ends them: a file handshake sleeps while it waits for its peers.
//  * Large records (histograms) never live on the BPF stack: new map entries are initialised
//    from a never-written per-CPU "zero" array element.
//  * Buckets: exactly proto/buckets.py's scheme computed with shifts only (no division, no
//    floating point), so kernel and analyzer agree by construction.
#include <uapi/linux/ptrace.h>

#define HT_NUM_BUCKETS @NUM_BUCKETS@
#define HT_MIN_EXP @MIN_EXP@
#define HT_MAX_EXP @MAX_EXP@
#define HT_SUB_BITS @SUB_BUCKET_BITS@
#define HT_CTL_BUF 0
#define HT_CTL_GEN 1
#define HT_PID_EXCLUDED 1           // pids[tgid] bits: never record (the agent itself)
#define HT_PID_TRACKED 2            //                  scheduler evidence wanted
// sched_switch prev_state: the task-state report bits (S, D, T, t, X, Z, P, I). None set means the
// task was switched out runnable: "R" (yield) or TASK_REPORT_MAX (0x100 on 5.14+ kernels, which is
// what a preemption reports). Either way it waits in the run queue, involuntarily.
#define HT_BLOCKED_STATE_MASK 0xff

struct ht_key {
    u32 tgid;
    u32 api;
};

struct ht_hist {
    u64 count;
    u64 sum_ns;
    u64 min_ns;
    u64 max_ns;
    u64 nested;                     // probed calls made inside these calls (counted here, once)
    u64 buckets[HT_NUM_BUCKETS];
};

struct ht_thread {
    u64 start_ns;
    u64 gen;
    u32 api;
    u32 depth;
};

// Cumulative per process (tgid).
struct ht_proc {
    u64 sync_ns;                    // latency of returned outermost sync-kind calls
    u64 offcpu_ns;                  // idle: every active thread blocked outside CUDA calls
    u64 loader_ns;                  // the part of offcpu_ns that ended in a wake-up by the loader
    u64 io_ns;                      // the part of offcpu_ns with an active thread in D (own I/O)
    u64 idle_pending;               // idle time not yet attributed to whoever ended it
    u64 runq_ns;                    // starved: an active thread runnable, none running
    u64 involuntary;                // switched out runnable (preempted)
    u64 voluntary;                  // switched out blocked
    u64 last_ns;                    // last state change of any active thread
    u64 n[5];                       // active threads per HT_ST_* state (index state - 1)
    u64 runq[HT_NUM_BUCKETS];       // run-queue latency histogram (per wait of one thread)
};

// The recent step boundaries of one process (a ring; head counts every boundary ever).
#define HT_EVLOG_LEN @EVLOG_LEN@
struct ht_event {
    u64 ts_ns;
    u64 sync_ns;                    // the process's sync_ns as of this boundary
    u64 offcpu_ns;                  // the process's offcpu_ns as of this boundary
    u64 loader_ns;                  // the process's loader_ns as of this boundary
    u64 io_ns;                      // the process's io_ns as of this boundary
    u64 api;
};

// Who ended a wait (a wake-up's origin), for the idle time it ends.
#define HT_FROM_OTHER 0
#define HT_FROM_LOADER 1            // a loader worker (a child process of the rank), directly or
                                    // through another thread of the rank it woke first
// A thread of a tracked process (user space lists them from /proc/PID/task) and the origin of its
// last wake-up, so a thread that hands on what it was woken for (a pin-memory thread woken by a
// loader worker, waking the main thread) passes the origin on.
struct ht_member {
    u32 tgid;
    u32 origin;
};
struct ht_evlog {
    u64 head;
    struct ht_event ev[HT_EVLOG_LEN];
};

// Scheduler state of one active thread (key: tid).
#define HT_ST_RUNNING 1
#define HT_ST_QUEUED 2
#define HT_ST_IN_CALL 3             // blocked inside a probed call (its wait is that call's)
#define HT_ST_BLOCKED 4             // blocked outside probed calls
#define HT_ST_BLOCKED_IO 5          // blocked outside probed calls, uninterruptibly (D: I/O)
// sched_switch prev_state's D bit (TASK_UNINTERRUPTIBLE in the task-state report)
#define HT_STATE_D 0x2
struct ht_task {
    u32 tgid;
    u32 state;                      // HT_ST_*; 0 until the process is tracked
    u64 queued_ns;                  // runnable since (0: not waiting for a CPU)
};

BPF_F_TABLE("percpu_hash", struct ht_key, struct ht_hist, stats0, 4096, BPF_F_NO_PREALLOC);
BPF_F_TABLE("percpu_hash", struct ht_key, struct ht_hist, stats1, 4096, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(zero_hist, struct ht_hist, 1);      // never written: the initial value
BPF_TABLE("lru_hash", u64, struct ht_thread, threads, 65536);
BPF_ARRAY(ctl, u64, 2);
BPF_HASH(pids, u32, u8, 8192);                        // HT_PID_* bits per tgid
// Entries are made by user space (track_pids) or by a sync-kind return, never by the scheduler
// hooks, which only look up.
BPF_F_TABLE("hash", u32, struct ht_proc, procs, 8192, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(zero_proc, struct ht_proc, 1);      // never written: the initial value
BPF_TABLE("lru_hash", u32, struct ht_task, active, 65536);
BPF_F_TABLE("hash", u32, struct ht_evlog, evlogs, 1024, BPF_F_NO_PREALLOC);
BPF_TABLE("lru_hash", u32, struct ht_member, members, 65536);   // tid -> (tgid, origin)
BPF_HASH(loaders, u32, u32, 8192);            // a loader worker's tgid -> its rank's tgid
BPF_ARRAY(zero_evlog, struct ht_evlog, 1);           // never written: the initial value

// HT_BUCKET_BEGIN (tests compile this block with gcc and compare it with proto/buckets.py)
static __always_inline u32 ht_log2(u64 v) {
    u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) { r += 1; }
    return r;
}

static __always_inline u32 ht_bucket(u64 ns) {
    if (ns < (1ULL << HT_MIN_EXP))
        return 0;
    if (ns >= (1ULL << HT_MAX_EXP))
        return HT_NUM_BUCKETS - 1;
    u32 e = ht_log2(ns);
    u32 sub = (u32)(ns >> (e - HT_SUB_BITS)) & ((1U << HT_SUB_BITS) - 1);
    return 1 + ((e - HT_MIN_EXP) << HT_SUB_BITS) + sub;
}
// HT_BUCKET_END

static __always_inline u64 ht_ctl(u32 idx) {
    u64 *v = ctl.lookup(&idx);
    return v ? *v : 0;
}

static __always_inline struct ht_hist *ht_slot(u32 buf, struct ht_key *key) {
    u32 zero = 0;
    struct ht_hist *init = zero_hist.lookup(&zero);
    if (!init)
        return 0;
    if (buf)
        return stats1.lookup_or_try_init(key, init);
    return stats0.lookup_or_try_init(key, init);
}

// Whether the process is idle by these counts: every active thread blocked outside CUDA calls.
static __always_inline int ht_idle(struct ht_proc *pr) {
    return (s64)pr->n[0] <= 0 && (s64)pr->n[1] <= 0 && (s64)pr->n[2] <= 0 &&
           ((s64)pr->n[3] > 0 || (s64)pr->n[4] > 0);
}

// Thread t of process pr changes state at now: charge the time since the process's last change to
// "starved" or "idle" by the counts before the change, then move t's count. A change that ends
// the process's idleness hands the idle time so far to the wake-up's `origin` (HT_FROM_*).
static __always_inline void ht_move(struct ht_proc *pr, struct ht_task *t, u32 to, u64 now,
                                    u32 origin) {
    u64 last = pr->last_ns;
    pr->last_ns = now;
    int was_idle = ht_idle(pr);
    if (last && now > last) {
        s64 running = (s64)pr->n[0], queued = (s64)pr->n[1];
        if (running <= 0 && queued > 0)
            __sync_fetch_and_add(&pr->runq_ns, now - last);
        else if (was_idle) {
            __sync_fetch_and_add(&pr->offcpu_ns, now - last);
            // a thread in D waits for the rank's own I/O, whoever wakes the process later
            if ((s64)pr->n[4] > 0)
                __sync_fetch_and_add(&pr->io_ns, now - last);
            else
                __sync_fetch_and_add(&pr->idle_pending, now - last);
        }
    }
    u32 from = t->state;
    // (never below zero: a count made afresh by track_pids after a forget does not know the
    // threads that were already counted)
    if (from >= HT_ST_RUNNING && from <= HT_ST_BLOCKED_IO && pr->n[from - 1] > 0)
        __sync_fetch_and_add(&pr->n[from - 1], (u64)-1);
    if (to >= HT_ST_RUNNING && to <= HT_ST_BLOCKED_IO)
        __sync_fetch_and_add(&pr->n[to - 1], 1);
    t->state = to;
    if (was_idle && !ht_idle(pr)) {
        u64 pending = pr->idle_pending;
        if (origin == HT_FROM_LOADER)
            __sync_fetch_and_add(&pr->loader_ns, pending);
        __sync_fetch_and_add(&pr->idle_pending, (u64)0 - pending);
    }
}

// A thread of a tracked process made a probed call: it is active from now on, and running.
static __always_inline void ht_mark_active(u64 id) {
    u32 tid = (u32)id;
    u32 tgid = id >> 32;
    struct ht_task *t = active.lookup(&tid);
    if (t && t->tgid == tgid && t->state == HT_ST_RUNNING)
        return;                     // (a thread making a call runs, whatever was recorded)
    if (!t || t->tgid != tgid) {
        struct ht_task fresh = {};
        fresh.tgid = tgid;          // a new thread, or a tid reused by another process
        active.update(&tid, &fresh);
        t = active.lookup(&tid);
        if (!t)
            return;
    }
    struct ht_proc *pr = procs.lookup(&tgid);
    if (pr)
        ht_move(pr, t, HT_ST_RUNNING, bpf_ktime_get_ns(), HT_FROM_OTHER);
}

// The HT_PID_* bits of this tgid (0 when absent).
static __always_inline u8 ht_pid_flags(u32 tgid) {
    u8 *f = pids.lookup(&tgid);
    return f ? *f : 0;
}

static __always_inline int ht_enter(struct pt_regs *ctx, u32 api) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u8 flags = ht_pid_flags(tgid);
    if (flags & HT_PID_EXCLUDED)
        return 0;
    u64 gen = ht_ctl(HT_CTL_GEN);
    struct ht_thread *t = threads.lookup(&id);
    if (t && t->depth > 0 && t->gen == gen) {
        // Inside an outer probed call of this thread: count it as nested, do not time it.
        t->depth += 1;
        struct ht_key key = {.tgid = tgid, .api = t->api};
        struct ht_hist *h = ht_slot((u32)ht_ctl(HT_CTL_BUF) & 1, &key);
        if (h)
            h->nested += 1;
        return 0;
    }
    if (flags & HT_PID_TRACKED)
        ht_mark_active(id);
    struct ht_thread fresh = {};
    fresh.start_ns = bpf_ktime_get_ns();
    fresh.gen = gen;
    fresh.api = api;
    fresh.depth = 1;
    threads.update(&id, &fresh);
    return 0;
}

static __always_inline u64 ht_since(u64 now, u64 then) {
    return now > then ? now - then : 0;
}

// One step boundary of (tgid, api) at time now: append it to the process's boundary log with the
// process's waits so far (user space diffs them between the boundaries it takes as a step).
static __always_inline void ht_boundary(u32 tgid, u32 api, u64 now) {
    u32 zero = 0;
    struct ht_proc *pr = procs.lookup(&tgid);
    struct ht_evlog *zlog = zero_evlog.lookup(&zero);
    if (!zlog)
        return;
    struct ht_evlog *lg = evlogs.lookup_or_try_init(&tgid, zlog);
    if (!lg)
        return;
    u64 h = lg->head;
    struct ht_event *e = &lg->ev[h & (HT_EVLOG_LEN - 1)];
    e->ts_ns = now;
    e->sync_ns = pr ? pr->sync_ns : 0;
    e->offcpu_ns = pr ? pr->offcpu_ns : 0;
    e->loader_ns = pr ? pr->loader_ns : 0;
    e->io_ns = pr ? pr->io_ns : 0;
    e->api = api;
    lg->head = h + 1;
}

// A sync-kind call of tgid returned after delta ns: it is a wait of the process.
static __always_inline void ht_add_sync(u32 tgid, u64 delta) {
    u32 zero = 0;
    struct ht_proc *init = zero_proc.lookup(&zero);
    if (!init)
        return;
    struct ht_proc *pr = procs.lookup_or_try_init(&tgid, init);
    if (pr)
        __sync_fetch_and_add(&pr->sync_ns, delta);
}

// periodic / sync are compile-time constants per slot, so launch slots compile the extra work out.
static __always_inline int ht_leave(struct pt_regs *ctx, u32 slot, int periodic, int sync) {
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct ht_thread *t = threads.lookup(&id);
    if (!t || t->depth == 0)
        return 0;                   // entry not seen (attached mid-call) or excluded pid
    if (t->gen != ht_ctl(HT_CTL_GEN)) {
        threads.delete(&id);        // stale record from before a detach
        return 0;
    }
    if (t->depth > 1) {
        t->depth -= 1;
        return 0;
    }
    u64 delta = now - t->start_ns;
    u32 api = t->api;
    u32 tgid = id >> 32;
    struct ht_key key = {.tgid = tgid, .api = api};
    // The buffer is chosen at return, so a call that spans a flip lands in the new window.
    struct ht_hist *h = ht_slot((u32)ht_ctl(HT_CTL_BUF) & 1, &key);
    threads.delete(&id);
    if (h) {
        u32 b = ht_bucket(delta);
        if (b >= HT_NUM_BUCKETS)
            b = HT_NUM_BUCKETS - 1;
        if (h->count == 0 || delta < h->min_ns)
            h->min_ns = delta;
        if (delta > h->max_ns)
            h->max_ns = delta;
        h->count += 1;
        h->sum_ns += delta;
        h->buckets[b] += 1;
    }
    if (periodic && api == slot) {
        // The sync's own latency first, so the interval it ends counts it as a wait.
        if (sync)
            ht_add_sync(tgid, delta);
        ht_boundary(tgid, api, now);
    }
    return 0;
}

// Entry-only slot (the step marker): the call itself is the boundary.
static __always_inline int ht_mark(struct pt_regs *ctx, u32 slot) {
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u8 flags = ht_pid_flags(tgid);
    if (flags & HT_PID_EXCLUDED)
        return 0;
    if (flags & HT_PID_TRACKED)
        ht_mark_active(id);
    ht_boundary(tgid, slot, now);
    return 0;
}

// ---- scheduler evidence ----


// Whether thread id is inside a probed call now (per the current generation).
static __always_inline u32 ht_in_call(u64 id) {
    struct ht_thread *c = threads.lookup(&id);
    return c && c->depth > 0 && c->gen == ht_ctl(HT_CTL_GEN);
}

// The counters of tgid when it is tracked, else 0 (untracked: its threads may still be active).
static __always_inline struct ht_proc *ht_tracked(u32 tgid) {
    if (!(ht_pid_flags(tgid) & HT_PID_TRACKED))
        return 0;
    return procs.lookup(&tgid);
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = args->prev_pid;
    struct ht_task *t = active.lookup(&prev);
    if (t) {
        u64 id = bpf_get_current_pid_tgid();   // prev is still current here
        u32 tgid = id >> 32;
        struct ht_proc *pr = ht_tracked(tgid);
        // A tid reused by another process keeps a stale record until that thread's next probed
        // call: it is not accounted meanwhile.
        if (pr && t->tgid == tgid) {
            if ((args->prev_state & HT_BLOCKED_STATE_MASK) == 0) {
                __sync_fetch_and_add(&pr->involuntary, 1);
                t->queued_ns = now;
                ht_move(pr, t, HT_ST_QUEUED, now, HT_FROM_OTHER);
            } else {
                __sync_fetch_and_add(&pr->voluntary, 1);
                t->queued_ns = 0;
                u32 to = ht_in_call(id) ? HT_ST_IN_CALL
                         : (args->prev_state & HT_STATE_D) ? HT_ST_BLOCKED_IO : HT_ST_BLOCKED;
                ht_move(pr, t, to, now, HT_FROM_OTHER);
            }
        }
    }
    u32 next = args->next_pid;
    t = active.lookup(&next);
    if (t) {
        u64 queued = t->queued_ns;
        u32 tgid = t->tgid;
        t->queued_ns = 0;
        struct ht_proc *pr = ht_tracked(tgid);
        if (pr) {
            if (queued && now > queued) {
                u32 b = ht_bucket(now - queued);
                if (b >= HT_NUM_BUCKETS)
                    b = HT_NUM_BUCKETS - 1;
                __sync_fetch_and_add(&pr->runq[b], 1);
            }
            ht_move(pr, t, HT_ST_RUNNING, now, HT_FROM_OTHER);
        }
    }
    return 0;
}

// The origin of a wake-up of a thread of process tgid by the current task (sched_waking runs in
// the waker's context): one of the process's loader workers, or a thread of the process passing
// on the origin of its own last wake-up; anything else (a peer's data arriving, a timer, I/O)
// is "other".
static __always_inline u32 ht_wake_origin(u32 tgid) {
    u64 id = bpf_get_current_pid_tgid();
    u32 wtgid = id >> 32;
    u32 wtid = (u32)id;
    if (wtgid == tgid) {
        struct ht_member *w = members.lookup(&wtid);
        return w ? w->origin : HT_FROM_OTHER;
    }
    u32 *rank = loaders.lookup(&wtgid);
    return rank && *rank == tgid ? HT_FROM_LOADER : HT_FROM_OTHER;
}

static __always_inline int ht_wakeup(u32 tid) {
    struct ht_member *m = members.lookup(&tid);
    struct ht_task *t = active.lookup(&tid);
    u32 tgid;
    if (t)
        tgid = t->tgid;
    else if (m)
        tgid = m->tgid;
    else
        return 0;
    u32 origin = ht_wake_origin(tgid);
    if (m)
        m->origin = origin;
    if (!t)
        return 0;
    u64 now = bpf_ktime_get_ns();
    // A wake-up of a thread that has not blocked yet (it is still on its CPU) also lands here:
    // only a blocked thread becomes queued.
    if (t->state == HT_ST_IN_CALL || t->state == HT_ST_BLOCKED || t->state == HT_ST_BLOCKED_IO) {
        struct ht_proc *pr = ht_tracked(t->tgid);
        if (pr)
            ht_move(pr, t, HT_ST_QUEUED, now, origin);
        t->queued_ns = now;
    }
    return 0;
}

// sched_waking, not sched_wakeup: it runs in the waker's context, which is what the origin is
// read from (sched_wakeup may run on the target's CPU, from an interrupt).
TRACEPOINT_PROBE(sched, sched_waking) { return ht_wakeup(args->pid); }

TRACEPOINT_PROBE(sched, sched_wakeup_new) { return ht_wakeup(args->pid); }

// A thread that exits leaves no record behind (tids are reused).
TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct ht_task *t = active.lookup(&tid);
    if (t) {
        struct ht_proc *pr = ht_tracked(t->tgid);
        if (pr && t->tgid == (u32)(id >> 32))
            ht_move(pr, t, 0, bpf_ktime_get_ns(), HT_FROM_OTHER);
    }
    active.delete(&tid);
    threads.delete(&id);
    return 0;
}

// ---- one entry/return pair per probed API slot (entry only for the marker; generated) ----
@PROBE_FUNCS@
