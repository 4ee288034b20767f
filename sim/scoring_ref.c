/* The compiled reference of one epoch's GPU scoring (sim/scoring_ref.py loads it).
 *
 * Why: "fast" needs a reference that is not the analyzer's code and not numpy. This is the
 * straightforward single-threaded C version of the statistics the analyzer computes per API on
 * the GPU basis (analyzer/score/scoring.py: score_api), from the same ingested data (the
 * serialized Histogram messages an epoch's accumulator keeps):
 *
 *   - each Histogram message decoded (varints) and added into a GPU-major (G x K) matrix of the
 *     buckets that hold data (several processes of one GPU add up);
 *   - per GPU: its calls, each configured quantile by linear interpolation inside the bucket
 *     that holds it, and that quantile's sampling error (sqrt(q(1-q)n) x bucket width / calls in
 *     the bucket holding the value);
 *   - per stat, across the GPUs with min_samples calls: the median and quartiles (numpy's
 *     "linear" percentile), the MAD (floored at mad_floor x |median| and 1e-9), the quartiles
 *     re-read without the values beyond the z cut where more than a tenth (and under a third)
 *     are beyond it; per GPU the robust z on max(MAD, 0.6745 SE), the Tukey fences and the
 *     effect gate; the high and low flags.
 *
 * Order statistics come from quickselect (O(n)), not a sort. Every float operation is the one
 * numpy performs, in the same order (compiled with -ffp-contract=off: no fused multiply-add), so
 * the flags are bit-for-bit those of the analyzer's score_api; the bench checks it each epoch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hist_wire.h"   /* proto/: the message header, as the analyzer reads it */

#define NUM_BUCKETS 226

typedef struct {
    double z_threshold, iqr_k, min_effect, mad_floor, min_samples;
    int64_t min_gpus;
} ref_params;

static void swap_d(double *a, double *b) {
    double t = *a;
    *a = *b;
    *b = t;
}

/* Rearrange x[0..n) so that x[k] is the value a sort would put there, the values before it
 * <= it and those after >= it (Hoare partition, median-of-three pivot). */
static void select_kth(double *x, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        if (x[mid] < x[lo]) swap_d(&x[mid], &x[lo]);
        if (x[hi] < x[lo]) swap_d(&x[hi], &x[lo]);
        if (x[hi] < x[mid]) swap_d(&x[hi], &x[mid]);
        double pivot = x[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (x[i] < pivot) i++;
            while (x[j] > pivot) j--;
            if (i <= j) {
                swap_d(&x[i], &x[j]);
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else return;
    }
}

/* The value a sort would put at k, and at k + 1 (k + 1 < n), of x[0..n) (rearranged). */
static void order_pair(double *x, int64_t n, int64_t k, double *a, double *b) {
    select_kth(x, n, k);
    *a = x[k];
    if (k + 1 < n) {
        double m = x[k + 1];
        for (int64_t i = k + 2; i < n; i++)
            if (x[i] < m) m = x[i];
        *b = m;
    } else {
        *b = x[k];
    }
}

/* numpy's percentile (method "linear") of x[0..n), n >= 1 (x rearranged). ``from``: a
 * position already in place (x[i] <= x[from] for i < from, >= for i > from; 0 when none is),
 * at or below this quantile's: the search starts there. Sets *at to this quantile's position. */
static double percentile(double *x, int64_t n, double q, int64_t from, int64_t *at) {
    double v = (double)(n - 1) * q;
    double fl = floor(v);
    int64_t lo = (int64_t)fl;
    if (lo > n - 1) lo = n - 1;
    if (lo < from) from = 0;
    double gamma = v - fl;
    double a, b;
    order_pair(x + from, n - from, lo - from, &a, &b);
    if (lo + 1 > n - 1) b = a;
    *at = lo;
    double diff = b - a;
    return gamma >= 0.5 ? b - diff * (1.0 - gamma) : a + diff * gamma;
}

/* numpy's median: the middle value, or the mean of the two middle ones (x rearranged). */
static double median_of(double *x, int64_t n) {
    if (n % 2) {
        select_kth(x, n, n / 2);
        return x[n / 2];
    }
    double a, b;
    order_pair(x, n, n / 2 - 1, &a, &b);
    return (a + b) / 2.0;
}

/* The bucket holding a value (ns): searchsorted(LOWER_NS, x, "right") - 1, clipped. */
static int64_t bucket_holding(const double *lower, double x) {
    int64_t lo = 0, hi = NUM_BUCKETS;          /* first index with lower[i] > x */
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (lower[mid] > x) hi = mid;
        else lo = mid + 1;
    }
    int64_t b = lo - 1;
    return b < 0 ? 0 : (b > NUM_BUCKETS - 1 ? NUM_BUCKETS - 1 : b);
}

/* Score one API of g GPUs from its serialized Histogram messages.
 *
 * wire, ends, m: the messages back to back and where each ends; local: each message's GPU
 * (0..g-1); totals: each message's stated calls (NaN: add up its counts). lower, upper: the
 * bucket scheme's edges (ns). qs: the s quantiles. Out, each s x g (stat-major): values (µs,
 * NaN where unscored), high and low flags. scratch: scratch_size doubles the matrix may use
 * (reused from API to API). Returns 0, or -1 for a message laid out otherwise
 * (the caller says so), -2 when out of memory. */
int ref_score_api(const uint8_t *wire, const int64_t *ends, int64_t m, const int64_t *local,
                  const double *totals, int64_t g, const double *lower, const double *upper,
                  const double *qs, int64_t s, const ref_params *prm, double *values,
                  uint8_t *high, uint8_t *low, double *scratch, int64_t scratch_size) {
    int64_t *hdr = malloc(sizeof(int64_t) * 3 * (size_t)(m > 0 ? m : 1));
    if (!hdr) return -2;
    int64_t lo = INT64_MAX, top = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t b = i ? ends[i - 1] : 0;
        if (ht_parse_header(wire, b, ends[i], &hdr[3 * i], &hdr[3 * i + 1], &hdr[3 * i + 2])) {
            free(hdr);
            return -1;
        }
        if (hdr[3 * i + 2] > 0) {
            if (hdr[3 * i + 1] < lo) lo = hdr[3 * i + 1];
            if (hdr[3 * i + 1] + hdr[3 * i + 2] > top) top = hdr[3 * i + 1] + hdr[3 * i + 2];
        }
    }
    if (lo == INT64_MAX) lo = top = 0;
    int64_t k = top - lo > 0 ? top - lo : 1;
    /* the caller's buffer when it is large enough: a fresh matrix pays its page faults */
    int own = g * k > scratch_size;
    double *dense = own ? calloc((size_t)(g * k), sizeof(double)) : scratch;
    if (!own) memset(dense, 0, sizeof(double) * (size_t)(g * k));
    double *calls = calloc((size_t)(g > 0 ? g : 1), sizeof(double));
    double *se = malloc(sizeof(double) * (size_t)(s * g + 1));
    double *x = malloc(sizeof(double) * (size_t)(g + 1));
    double *dev = malloc(sizeof(double) * (size_t)(g + 1));
    uint8_t *ok = malloc((size_t)(g + 1));
    if (!dense || !calls || !se || !x || !dev || !ok) {
        free(hdr); if (own) free(dense); free(calls); free(se); free(x); free(dev); free(ok);
        return -2;
    }
    for (int64_t i = 0; i < m; i++) {
        int64_t len = hdr[3 * i + 2];
        if (len == 0) continue;                 /* an empty histogram adds nothing */
        double *row = dense + local[i] * k + (hdr[3 * i + 1] - lo);
        int64_t p = hdr[3 * i], e = ends[i];
        uint64_t sum = 0, v = 0;
        int shift = 0;
        int64_t j = 0;
        for (; p < e; p++) {
            uint8_t c = wire[p];
            v |= (uint64_t)(c & 0x7F) << shift;
            if (c & 0x80) {
                shift += 7;
                continue;
            }
            row[j++] += (double)v;
            sum += v;
            v = 0;
            shift = 0;
        }
        calls[local[i]] += isnan(totals[i]) ? (double)sum : totals[i];
    }
    /* per GPU: quantiles, the bucket each was read from, sampling errors */
    int64_t n_ok = 0;
    for (int64_t c = 0; c < g; c++) {
        const double *row = dense + c * k;
        double total = 0.0;
        for (int64_t j = 0; j < k; j++) total += row[j];
        int finite = 1;
        for (int64_t q = 0; q < s; q++) {
            double t = total * qs[q];
            double cum = 0.0, below = 0.0;
            int64_t idx = 0;
            for (; idx < k; idx++) {             /* first bucket whose cumulative count >= t */
                below = cum;
                cum += row[idx];
                if (!(cum < t)) break;
            }
            if (idx == k) idx = k - 1;           /* capped: cum and below are its bucket's */
            double inside = cum - below;
            double frac = 0.5;
            if (inside > 0) frac = (t - below) / inside;
            frac = frac < 0.0 ? 0.0 : (frac > 1.0 ? 1.0 : frac);
            int64_t b = idx + lo;
            double val = (frac * (upper[b] - lower[b]) + lower[b]) / 1000.0;
            if (total <= 0) val = NAN;
            values[q * g + c] = val;
            if (isnan(val)) {
                se[q * g + c] = NAN;
                finite = 0;
                continue;
            }
            double x_ns = val * 1e3;
            double from = b ? lower[b] : -INFINITY;
            double until = b < NUM_BUCKETS - 1 ? lower[b + 1] : INFINITY;
            int64_t hb = (from <= x_ns && x_ns < until) ? b : bucket_holding(lower, x_ns);
            int64_t col = hb - lo;
            col = col < 0 ? 0 : (col > k - 1 ? k - 1 : col);
            double in_bucket = row[col];
            double width_us = (upper[hb] - lower[hb]) / 1e3;
            double qq = qs[q];
            se[q * g + c] = sqrt(qq * (1.0 - qq) * calls[c]) * width_us
                            / (in_bucket > 1.0 ? in_bucket : 1.0);
            if (!isfinite(val)) finite = 0;
        }
        ok[c] = calls[c] >= prm->min_samples && finite;
        n_ok += ok[c];
    }
    if (n_ok < prm->min_gpus) {
        memset(ok, 0, (size_t)g);
        n_ok = 0;
    }
    memset(high, 0, (size_t)(s * g));
    memset(low, 0, (size_t)(s * g));
    for (int64_t q = 0; q < s; q++) {
        double *v = values + q * g;
        if (n_ok == 0) {
            for (int64_t c = 0; c < g; c++) v[c] = NAN;
            continue;
        }
        int64_t n = 0;
        for (int64_t c = 0; c < g; c++)
            if (ok[c]) x[n++] = v[c];
        int64_t at = 0;                          /* each search starts where the last ended */
        double q1 = percentile(x, n, 0.25, 0, &at);
        double med = percentile(x, n, 0.5, at, &at);
        double q3 = percentile(x, n, 0.75, at, &at);
        for (int64_t i = 0; i < n; i++) dev[i] = fabs(x[i] - med);
        double mad = median_of(dev, n);
        double floor_ = prm->mad_floor * fabs(med);
        if (floor_ < 1e-9) floor_ = 1e-9;
        if (mad < floor_) mad = floor_;
        if (n >= 32) {                           /* the fence re-read under contamination */
            int64_t far = 0;
            for (int64_t i = 0; i < n; i++)
                far += fabs(0.6745 * (x[i] - med) / mad) > prm->z_threshold;
            if ((double)far > 0.10 * (double)n && 3 * far < n) {
                int64_t r = 0;
                for (int64_t i = 0; i < n; i++)
                    if (!(fabs(0.6745 * (x[i] - med) / mad) > prm->z_threshold)) dev[r++] = x[i];
                if (r >= 4) {
                    q1 = percentile(dev, r, 0.25, 0, &at);
                    q3 = percentile(dev, r, 0.75, at, &at);
                }
            }
        }
        double iqr = q3 - q1;
        double hi_fence = q3 + prm->iqr_k * iqr, lo_fence = q1 - prm->iqr_k * iqr;
        double med_pos = med > 0 ? med : NAN;
        for (int64_t c = 0; c < g; c++) {
            if (!ok[c]) {
                v[c] = NAN;
                continue;
            }
            double e = se[q * g + c];
            double scaled = 0.6745 * e;
            double scale;
            if (isinf(scaled)) scale = 0.6745 * 1.7976931348623157e308 > mad
                                       ? 0.6745 * 1.7976931348623157e308 : mad;
            else scale = isnan(scaled) ? mad : (scaled > mad ? scaled : mad);
            double z = 0.6745 * (v[c] - med) / scale;
            double ratio = v[c] / med_pos;
            int effect = fabs(ratio - 1.0) >= prm->min_effect;
            high[q * g + c] = z > prm->z_threshold && v[c] > hi_fence && effect;
            low[q * g + c] = z < -prm->z_threshold && v[c] < lo_fence && effect;
        }
    }
    free(hdr); if (own) free(dense); free(calls); free(se); free(x); free(dev); free(ok);
    return 0;
}
