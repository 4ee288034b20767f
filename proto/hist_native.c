/* The compiled half of building an epoch's histogram matrices (proto/hist_native.py).
 *
 * An accumulator keeps each process's serialized Histogram messages back to back
 * (analyzer/score/hist_wire.py says why). Building the epoch decodes every varint of them and
 * scatters the counts into a bucket-major (K, G) matrix: numpy needs a dozen passes over ~5 MB
 * per API at 16,384 GPUs for that (varint folding, searches for each message's header, a
 * repeat, a scatter), C one pass for the headers and one for the counts.
 *
 * The same layout rule as the numpy parser: fields in number order (scheme, first_bucket,
 * packed counts last), as the protobuf runtime writes them; any other layout returns -1 and
 * the caller takes the numpy path, which hands such messages to the protobuf parser. */
#include <stdint.h>

#include "hist_wire.h"

/* Per message i of the m ending at ends[i]: its first bucket, its number of counts and the
 * byte where they start (hist_wire.h). 0, or -1 for a layout other than the protobuf
 * runtime's. */
int ht_wire_headers(const uint8_t *wire, const int64_t *ends, int64_t m, int64_t *firsts,
                    int64_t *lens, int64_t *cstarts) {
    for (int64_t i = 0; i < m; i++)
        if (ht_parse_header(wire, i ? ends[i - 1] : 0, ends[i], &cstarts[i], &firsts[i],
                            &lens[i]))
            return -1;
    return 0;
}

/* Messages decoded per block before their counts go into the matrix (see ht_wire_scatter). */
#define BLOCK 256

/* Add the counts of every message with counts into dense (K, n) at row first - lo, column
 * local[i]; per_gpu[local[i]] += its stated total, or the sum of its counts where the total
 * is NaN. dense and per_gpu come zeroed; tmp holds BLOCK x K doubles. Returns 0, or -1 when a
 * count is above 2^53 (not exact as a double: the numpy path rounds it the same way, so it
 * decides).
 *
 * Why blocks: a message's counts go down one column of the bucket-major matrix, one row
 * (n x 8 bytes, at 16,384 GPUs 128 KiB: a multiple of 4 KiB) apart, so all of them fall in
 * the same set of the L1 cache and evict each other. A block of messages is decoded into tmp,
 * one message per row, then added row of dense by row of dense: consecutive messages are
 * consecutive GPUs, so each row of dense is written along. Each cell adds its messages in
 * message order, as the numpy path does. */
int ht_wire_scatter(const uint8_t *wire, const int64_t *ends, int64_t m,
                    const int64_t *firsts, const int64_t *lens, const int64_t *cstarts,
                    const int64_t *local, const double *totals, int64_t lo, int64_t k,
                    int64_t n, double *dense, double *per_gpu, double *tmp) {
    for (int64_t b0 = 0; b0 < m; b0 += BLOCK) {
        int64_t b1 = b0 + BLOCK < m ? b0 + BLOCK : m;
        int64_t r0 = k, r1 = 0;                      /* the block's rows of dense */
        for (int64_t i = b0; i < b1; i++) {
            if (lens[i] == 0) continue;             /* an empty histogram adds nothing */
            int64_t f = firsts[i] - lo;
            if (f < r0) r0 = f;
            if (f + lens[i] > r1) r1 = f + lens[i];
        }
        if (r1 <= r0) continue;
        for (int64_t i = b0; i < b1; i++) {
            double *row = tmp + (i - b0) * k;
            for (int64_t r = r0; r < r1; r++) row[r] = 0.0;
            if (lens[i] == 0) continue;
            double *cell = row + (firsts[i] - lo);
            uint64_t v = 0, sum = 0;
            int shift = 0;
            for (int64_t p = cstarts[i], e = ends[i]; p < e; p++) {
                uint8_t c = wire[p];
                v |= (uint64_t)(c & 0x7F) << shift;
                if (c & 0x80) {
                    shift += 7;
                    if (shift > 63) return -1;              /* no varint is this long */
                    continue;
                }
                if (v > ((uint64_t)1 << 53)) return -1;
                *cell++ = (double)v;
                sum += v;
                v = 0;
                shift = 0;
            }
            double t = totals[i];
            per_gpu[local[i]] += t != t ? (double)sum : t;
        }
        for (int64_t r = r0; r < r1; r++) {
            double *out = dense + r * n;
            for (int64_t i = b0; i < b1; i++)
                if (lens[i]) out[local[i]] += tmp[(i - b0) * k + r];
        }
    }
    return 0;
}
