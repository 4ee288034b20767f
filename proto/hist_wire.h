/* The header of one serialized Histogram message, read as the protobuf runtime writes it:
 * fields in number order (scheme, first_bucket, packed counts last). Shared by the analyzer's
 * histogram decoder (proto/hist_native.c) and the benchmarks' reference pass
 * (sim/scoring_ref.c), which include it; their builds hash it with their own source
 * (proto/cbuild.py, ``depends``). */
#ifndef HT_HIST_WIRE_H
#define HT_HIST_WIRE_H
#include <stdint.h>

static int ht_read_varint(const uint8_t *buf, int64_t *p, int64_t end, uint64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    while (*p < end) {
        uint8_t c = buf[(*p)++];
        v |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            *out = v;
            return 0;
        }
        shift += 7;
        if (shift > 63) return -1;
    }
    return -1;
}

/* Of the message in wire[b, e): the byte where its packed counts start, its first bucket and
 * its number of counts. 0, or -1 for a layout other than the protobuf runtime's (the caller
 * then takes a slower path that hands such messages to the protobuf parser). */
static int ht_parse_header(const uint8_t *wire, int64_t b, int64_t e, int64_t *cstart,
                           int64_t *first, int64_t *len) {
    int64_t p = b;
    uint64_t v;
    *first = 0;
    *len = 0;
    *cstart = e;
    if (p < e && wire[p] == 0x08) {
        p++;
        if (ht_read_varint(wire, &p, e, &v)) return -1;
    }
    if (p < e && wire[p] == 0x10) {
        p++;
        if (ht_read_varint(wire, &p, e, &v)) return -1;
        if (v > (uint64_t)1 << 31) return -1;
        *first = (int64_t)v;
    }
    if (p < e && wire[p] == 0x1A) {
        p++;
        if (ht_read_varint(wire, &p, e, &v)) return -1;
        if (v != (uint64_t)(e - p)) return -1;
        *cstart = p;
        int64_t n = 0;
        for (int64_t j = p; j < e; j++) n += wire[j] < 0x80;
        if (e > p && wire[e - 1] >= 0x80) return -1;   /* a varint cut at the end */
        *len = n;
        return 0;
    }
    return p == e ? 0 : -1;
}
#endif
