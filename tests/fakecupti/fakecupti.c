// A stand-in libcupti for tests on machines without CUDA (no real CUPTI can load there).
//
// It implements the Callback API calls the in-process backend makes (cuptiSubscribe,
// cuptiSubscribe_v2, cuptiEnableCallback, cuptiUnsubscribe, cuptiGetCallbackName,
// cuptiGetResultString) with CUPTI's signatures and result codes, and a driver for the test:
// fakecupti_call(domain, cbid, ns) plays one CUDA call of `ns` nanoseconds, firing the enter and
// exit callbacks exactly when real CUPTI would (subscribed and that id enabled).
//
// FAKECUPTI_HELD_BY=NAME in the environment plays another tool holding CUPTI: subscribing fails
// with CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39) and names NAME, until
// fakecupti_release() is called.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*cb_t)(void *, int, uint32_t, const void *);
typedef struct {
    int callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} cbdata_t;
typedef struct {
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;
    size_t oldSubscriberSize;
} params_t;

#define NCB 1024
static cb_t cb;
static void *ud;
static int subscribed, released;
static unsigned char enabled[3][NCB];
static uint32_t next_corr = 1;
static long enable_calls;

struct name { int domain; uint32_t cbid; const char *name; };
static const struct name names[] = {
    {2, 3, "cudaGetDevice_v3020"},
    {2, 211, "cudaLaunchKernel_v7000"},
    {2, 214, "cudaLaunchKernel_ptsz_v7000"},
    {2, 430, "cudaLaunchKernelExC_v11060"},
    {2, 131, "cudaStreamSynchronize_v3020"},
    {2, 165, "cudaDeviceSynchronize_v3020"},
    {2, 166, "cudaEventSynchronize_v3020"},
    {2, 311, "cudaGraphLaunch_v10000"},
    {1, 307, "cuLaunchKernel"},
    {1, 442, "cuLaunchKernel_ptsz"},
    {1, 125, "cuStreamSynchronize"},
    {1, 517, "cuGraphLaunch"},
    {0, 0, 0},
};

static const char *held_by(void) {
    const char *h = getenv("FAKECUPTI_HELD_BY");
    return (h && *h && !released) ? h : NULL;
}

int cuptiGetCallbackName(int domain, uint32_t cbid, const char **out) {
    for (const struct name *n = names; n->name; n++)
        if (n->domain == domain && n->cbid == cbid) { *out = n->name; return 0; }
    return 1;                                   // CUPTI_ERROR_INVALID_PARAMETER
}

int cuptiGetResultString(int r, const char **out) {
    *out = r == 39 ? "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
         : r == 0 ? "CUPTI_SUCCESS" : "CUPTI_ERROR_UNKNOWN";
    return 0;
}

int cuptiSubscribe(void **sub, cb_t f, void *u) {
    if (subscribed || held_by()) return 39;
    cb = f; ud = u; subscribed = 1; *sub = (void *)&cb;
    return 0;
}

int cuptiSubscribe_v2(void **sub, cb_t f, void *u, params_t *p) {
    const char *h = subscribed ? "hypertrace" : held_by();
    if (h) {
        if (p && p->oldSubscriberName && p->oldSubscriberSize) {
            strncpy(p->oldSubscriberName, h, p->oldSubscriberSize - 1);
            p->oldSubscriberName[p->oldSubscriberSize - 1] = 0;
        }
        return 39;
    }
    return cuptiSubscribe(sub, f, u);
}

int cuptiUnsubscribe(void *sub) {
    (void)sub;
    subscribed = 0;
    memset(enabled, 0, sizeof enabled);
    return 0;
}

int cuptiEnableCallback(uint32_t on, void *sub, int domain, uint32_t cbid) {
    (void)sub;
    if (!subscribed || domain < 1 || domain > 2 || cbid >= NCB) return 1;
    enabled[domain][cbid] = on ? 1 : 0;
    enable_calls++;
    return 0;
}

static void spin(uint64_t ns) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do {
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((uint64_t)(b.tv_sec - a.tv_sec) * 1000000000ULL + (uint64_t)(b.tv_nsec - a.tv_nsec) < ns);
}

// One CUDA call of `ns` nanoseconds in `domain` (1 driver, 2 runtime); `inner_cbid` > 0 plays a
// driver call made inside it (as cudaLaunchKernel calls cuLaunchKernel).
void fakecupti_call(int domain, uint32_t cbid, uint64_t ns, uint32_t inner_cbid) {
    int fire = subscribed && domain >= 1 && domain <= 2 && cbid < NCB && enabled[domain][cbid];
    uint64_t corr_data = 0;
    cbdata_t d = {0};
    d.correlationData = &corr_data;
    d.correlationId = next_corr++;
    if (fire) { d.callbackSite = 0; cb(ud, domain, cbid, &d); }
    if (inner_cbid) {
        fakecupti_call(1, inner_cbid, ns / 2, 0);
        spin(ns / 2);
    } else {
        spin(ns);
    }
    // as CUPTI: a callback disabled (or unsubscribed) during the call reports no exit
    if (fire && subscribed && enabled[domain][cbid]) { d.callbackSite = 1; cb(ud, domain, cbid, &d); }
}

void fakecupti_release(void) { released = 1; }
int fakecupti_subscribed(void) { return subscribed; }
int fakecupti_enabled(int domain, uint32_t cbid) { return enabled[domain][cbid]; }
long fakecupti_enable_calls(void) { return enable_calls; }
/* cudaGetDevice's signature, for the calibration's timed loop: counts its calls. */
static long get_device_calls;
int fakecupti_get_device(int *dev) { *dev = 0; get_device_calls++; return 0; }
long fakecupti_get_device_calls(void) { return get_device_calls; }
