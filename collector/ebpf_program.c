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
//  * Generation: ctl[HT_CTL_GEN] is bumped by user space on every attach/detach. A thread record
//    from an older generation may have lost its return probe (detached mid-call), so it is
//    treated as absent rather than as an enclosing call forever.
//  * Buckets: exactly proto/buckets.py's scheme computed with shifts only (no division, no
//    floating point), so kernel and analyzer agree by construction.
#include <uapi/linux/ptrace.h>

#define HT_NUM_BUCKETS @NUM_BUCKETS@
#define HT_MIN_EXP @MIN_EXP@
#define HT_MAX_EXP @MAX_EXP@
#define HT_SUB_BITS @SUB_BUCKET_BITS@
#define HT_CTL_BUF 0
#define HT_CTL_GEN 1

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

BPF_F_TABLE("percpu_hash", struct ht_key, struct ht_hist, stats0, 4096, BPF_F_NO_PREALLOC);
BPF_F_TABLE("percpu_hash", struct ht_key, struct ht_hist, stats1, 4096, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(zero_hist, struct ht_hist, 1);      // never written: the initial value
BPF_TABLE("lru_hash", u64, struct ht_thread, threads, 65536);
BPF_ARRAY(ctl, u64, 2);
BPF_HASH(excluded, u32, u8, 1024);                    // the agent's own pids

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

static __always_inline int ht_enter(struct pt_regs *ctx, u32 api) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (excluded.lookup(&tgid))
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
    struct ht_thread fresh = {};
    fresh.start_ns = bpf_ktime_get_ns();
    fresh.gen = gen;
    fresh.api = api;
    fresh.depth = 1;
    threads.update(&id, &fresh);
    return 0;
}

static __always_inline int ht_leave(struct pt_regs *ctx) {
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    struct ht_thread *t = threads.lookup(&id);
    if (!t || t->depth == 0)
        return 0;                   // entry not seen (attached mid-call) or excluded pid
    if (t->gen != ht_ctl(HT_CTL_GEN)) {
        threads.delete(&id);        // stale record from before an attach/detach
        return 0;
    }
    if (t->depth > 1) {
        t->depth -= 1;
        return 0;
    }
    u64 delta = now - t->start_ns;
    struct ht_key key = {.tgid = id >> 32, .api = t->api};
    // The buffer is chosen at return, so a call that spans a flip lands in the new window.
    struct ht_hist *h = ht_slot((u32)ht_ctl(HT_CTL_BUF) & 1, &key);
    threads.delete(&id);
    if (!h)
        return 0;
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
    return 0;
}

// ---- one entry/return pair per probed API slot (generated) ----
@PROBE_FUNCS@
