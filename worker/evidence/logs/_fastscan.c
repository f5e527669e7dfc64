/* One native pass over a read of a log: split lines, read the strict vLLM stat lines.
 *
 * scan(data, end) looks at the lines of data[:end] (each ended by a newline; the last may not
 * be). A line is a *strict stat line* when it is at most MAX_LINE bytes of printable ASCII (or
 * ESC, for colour codes), holds "Avg prompt throughput", ends exactly with vLLM's canonical tail
 * (six plain numbers between fixed fragments, then '%'), and holds neither literal that opens a
 * traceback or Ray's unhandled-error block. For such a line it reads what the polars path of
 * worker/evidence/logs/engines.py reads, with the same semantics (the leftmost match of each of
 * its patterns on the part before the literal), so the values are identical. Every other line
 * (a rest line) is copied, byte for byte with its newline, into `rest`, for the polars path —
 * every one without rules, else only those the rules keep (`rules`, below: a line that holds no
 * flag literal, lies in no window and that nothing else of the polars path reads is counted and
 * dropped).
 *
 * scan(data, end, rules=None) returns (n_lines, rows, rest, starts, stops, ((schema, array),
 * (schema, array)), dropped): the line count, the stat lines read, the rest lines' bytes, each
 * stat line's byte offsets (int64, its newline excluded), then two Arrow C data interface
 * capsule pairs that polars imports without a copy: a struct of the stat columns (idx, index,
 * pid, ip, vts, tod, prompt, generation, running, waiting, kv, hit) and `where` (uint32: the line
 * index of each rest line kept), then the rest lines dropped. Every read of the input is bounded
 * by the read (data[:end]); the GIL is released during the pass.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <locale.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINE 4096
#define MAX_DIGITS 20

static locale_t c_locale;

static const char LITERAL[] = "Avg prompt throughput";
static const char *const FRAGMENTS[6] = {
    "Avg prompt throughput: ",
    " tokens/s, Avg generation throughput: ",
    " tokens/s, Running: ",
    " reqs, Waiting: ",
    " reqs, GPU KV cache usage: ",
    "%, Prefix cache hit rate: ",
};
static const char TRACEBACK[] = "Traceback (most recent call last)";
static const char UNHANDLED[] = "Unhandled error (suppress with ";

/* A growable byte buffer. */
typedef struct {
    char *data;
    size_t len;
    size_t cap;
} Buf;

static int buf_reserve(Buf *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *data = realloc(b->data, cap);
    if (!data) return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

/* Give back what doubling reserved beyond `len` (at least 8 bytes kept), when it is much: the
 * exported columns live as long as the scan's frames. A failed shrink keeps the buffer. */
static void buf_fit(Buf *b) {
    size_t want = b->len > 8 ? b->len : 8;
    if (b->cap < want + 65536) return;
    char *data = realloc(b->data, want);
    if (data) {
        b->data = data;
        b->cap = want;
    }
}

static int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

/* A string column: characters, int32 offsets (rows + 1), validity bytes. */
typedef struct {
    Buf chars;
    Buf offsets;
    Buf valid;
} Strings;

static int strings_init(Strings *s) {
    int32_t zero = 0;
    return buf_put(&s->offsets, &zero, sizeof zero);
}

/* Bit `row` of the validity bitmap `b` (least significant bit first, as Arrow's). */
static int bit_put(Buf *b, size_t row, int valid) {
    if (row % 8 == 0) {
        uint8_t zero = 0;
        if (buf_put(b, &zero, 1) < 0) return -1;
    }
    if (valid) b->data[row / 8] |= (char)(1u << (row % 8));
    return 0;
}

static int strings_add(Strings *s, size_t row, const char *src, size_t n, int valid) {
    if (s->chars.len + n > INT32_MAX) return -1;
    if (buf_put(&s->chars, src, n) < 0) return -1;
    int32_t end = (int32_t)s->chars.len;
    if (buf_put(&s->offsets, &end, sizeof end) < 0) return -1;
    return bit_put(&s->valid, row, valid);
}

/* A valid row of the `k` pieces joined. */
static int strings_join(Strings *s, size_t row, const char *const *src, const size_t *n, int k) {
    for (int i = 0; i < k; i++) {
        if (s->chars.len + n[i] > INT32_MAX || buf_put(&s->chars, src[i], n[i]) < 0) return -1;
    }
    int32_t end = (int32_t)s->chars.len;
    if (buf_put(&s->offsets, &end, sizeof end) < 0) return -1;
    return bit_put(&s->valid, row, 1);
}

static void strings_free(Strings *s) {
    free(s->chars.data);
    free(s->offsets.data);
    free(s->valid.data);
}

typedef struct {
    double numbers[6];
    int64_t tod;
    int tod_valid;
    const char *index;
    size_t index_len;
    const char *pid;
    size_t pid_len;
    const char *ip;
    size_t ip_len;
    const char *vts;  /* 14 bytes when set */
} Row;

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* The first `needle` in hay[:n]: its first byte by memchr, then the rest compared (the lines
 * are short, at most MAX_LINE bytes here: cheaper than memmem's set-up for each line). */
static const char *find(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0 || n < m) return NULL;
    const char *last = hay + (n - m); /* the last position a match can start */
    for (const char *q = memchr(hay, needle[0], (size_t)(last - hay) + 1); q;
         q = q < last ? memchr(q + 1, needle[0], (size_t)(last - q)) : NULL) {
        if (memcmp(q + 1, needle + 1, m - 1) == 0) return q;
    }
    return NULL;
}

/* A plain number (\d+(\.\d+)?, at most MAX_DIGITS digits each side) at p, before stop: its
 * value in *out and the position after it, or NULL. */
static const char *number(const char *p, const char *stop, double *out) {
    char text[2 * MAX_DIGITS + 2];
    const char *q = p;
    while (q < stop && is_digit(*q)) q++;
    size_t whole = (size_t)(q - p);
    if (whole == 0 || whole > MAX_DIGITS) return NULL;
    if (q < stop && *q == '.') {
        const char *f = q + 1;
        while (f < stop && is_digit(*f)) f++;
        size_t frac = (size_t)(f - q - 1);
        if (frac == 0 || frac > MAX_DIGITS) return NULL;
        q = f;
    }
    size_t n = (size_t)(q - p);
    /* Clinger's fast path: at most 15 digits and an exact power of ten give one correctly
     * rounded division (what a correct parser returns); anything longer goes to strtod. */
    if (n <= 16) {
        uint64_t mantissa = 0;
        int frac = 0, dot = 0;
        for (const char *c = p; c < q; c++) {
            if (*c == '.') {
                dot = 1;
                continue;
            }
            mantissa = mantissa * 10 + (uint64_t)(*c - '0');
            frac += dot;
        }
        static const double powers[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7,
                                        1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15};
        if (mantissa < (UINT64_C(1) << 53) && frac <= 15) {
            *out = (double)mantissa / powers[frac];
            return q;
        }
    }
    memcpy(text, p, n);
    text[n] = '\0';
    *out = strtod_l(text, NULL, c_locale);
    return q;
}

/* The canonical tail from `p` (which starts at the literal) to `stop` (the line's end). */
static int canonical_tail(const char *p, const char *stop, Row *row) {
    for (int i = 0; i < 6; i++) {
        size_t m = strlen(FRAGMENTS[i]);
        if ((size_t)(stop - p) < m || memcmp(p, FRAGMENTS[i], m) != 0) return 0;
        p = number(p + m, stop, &row->numbers[i]);
        if (!p) return 0;
    }
    return p + 1 == stop && *p == '%';
}

/* `Engine \d+: $` at the end of the head: the digits (else "0"). */
static void engine_index(const char *head, size_t n, Row *row) {
    row->index = "0";
    row->index_len = 1;
    if (n < 10 || head[n - 1] != ' ' || head[n - 2] != ':') return;
    size_t d = n - 2;
    while (d > 0 && is_digit(head[d - 1])) d--;
    size_t digits = n - 2 - d;
    if (digits == 0 || d < 7 || memcmp(head + d - 7, "Engine ", 7) != 0) return;
    row->index = head + d;
    row->index_len = digits;
}

/* The leftmost `pid=\d+(?:, ip=[^\s()]+)?`: pid digits and ip (NULL when absent). */
static void owner(const char *head, size_t n, Row *row) {
    row->pid = NULL;
    row->ip = NULL;
    for (size_t at = 0; at + 5 <= n; at++) {
        const char *hit = find(head + at, n - at, "pid=", 4);
        if (!hit) return;
        at = (size_t)(hit - head);
        if (at + 5 > n || !is_digit(head[at + 4])) continue;
        size_t q = at + 4;
        while (q < n && is_digit(head[q])) q++;
        row->pid = head + at + 4;
        row->pid_len = q - at - 4;
        if (q + 5 < n && memcmp(head + q, ", ip=", 5) == 0) {
            size_t r = q + 5;
            while (r < n && head[r] != ' ' && head[r] != '(' && head[r] != ')') r++;
            if (r > q + 5) {
                row->ip = head + q + 5;
                row->ip_len = r - q - 5;
            }
        }
        return;
    }
}

static int clock_at(const char *s) {
    /* \d\d-\d\d \d\d:\d\d:\d\d */
    static const char shape[] = "dd-dd dd:dd:dd";
    for (int i = 0; i < 14; i++) {
        if (shape[i] == 'd' ? !is_digit(s[i]) : s[i] != shape[i]) return 0;
    }
    return 1;
}

/* The leftmost `(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d`: its last 14 bytes.
 * Found from its first '-' (two matches cannot start in the other order than their '-': a match
 * spans 11 bytes after its '-', and no level ends on a digit). */
static void vllm_time(const char *head, size_t n, Row *row) {
    static const char *const levels[4] = {"INFO", "WARNING", "DEBUG", "ERROR"};
    static const size_t lengths[4] = {4, 7, 5, 5};
    row->vts = NULL;
    for (const char *q = memchr(head, '-', n); q;
         q = (size_t)(q - head) + 1 < n ? memchr(q + 1, '-', n - (size_t)(q - head) - 1) : NULL) {
        size_t k = (size_t)(q - head);
        if (k < 7 || k + 12 > n || !clock_at(head + k - 2) || head[k - 3] != ' ') continue;
        for (int i = 0; i < 4; i++) {
            size_t m = lengths[i];
            if (k - 3 >= m && memcmp(head + k - 3 - m, levels[i], m) == 0) {
                row->vts = head + k - 2;
                return;
            }
        }
    }
}

/* `^\[\d\d:\d\d:\d\d`: seconds of the day when each part is in range, else invalid. */
static void time_of_day(const char *head, size_t n, Row *row) {
    row->tod_valid = 0;
    if (n < 9 || head[0] != '[' || head[3] != ':' || head[6] != ':') return;
    int parts[3];
    for (int i = 0; i < 3; i++) {
        char a = head[1 + 3 * i], b = head[2 + 3 * i];
        if (!is_digit(a) || !is_digit(b)) return;
        parts[i] = (a - '0') * 10 + (b - '0');
    }
    if (parts[0] >= 24 || parts[1] >= 60 || parts[2] >= 60) return;
    row->tod = (int64_t)parts[0] * 3600 + parts[1] * 60 + parts[2];
    row->tod_valid = 1;
}

/* Whether line [p, p + n) (no newline) is a strict stat line; its fields in *row if so. */
static int at(const char *p, size_t n, size_t i, const char *literal, size_t m) {
    return n - i >= m && memcmp(p + i, literal, m) == 0;
}

/* The length of the head (what precedes the first stat literal), when the head is printable
 * ASCII (or ESC) without a block literal; else -1. The tail is checked by `canonical_tail`. */
/* Whether `literal` starts within p[:starts] (it may run on, within p[:n]). */
static int holds(const char *p, size_t starts, size_t n, const char *literal, size_t m) {
    const char *q = memchr(p, literal[0], starts);
    while (q) {
        size_t i = (size_t)(q - p);
        if (at(p, n, i, literal, m)) return 1;
        q = i + 1 < starts ? memchr(q + 1, literal[0], starts - i - 1) : NULL;
    }
    return 0;
}

static long head_length(const char *p, size_t n) {
    const char *lit = find(p, n, LITERAL, sizeof LITERAL - 1);
    if (!lit) return -1;
    size_t head = (size_t)(lit - p);
    int bad = 0;
    for (size_t i = 0; i < head; i++) { /* no early exit: vectorised */
        unsigned char c = (unsigned char)p[i];
        bad |= (c < 0x20 || c > 0x7e) & (c != 0x1b);
    }
    /* a block literal starting before the stat literal (it may run past it) */
    if (bad || holds(p, head, n, TRACEBACK, sizeof TRACEBACK - 1) ||
        holds(p, head, n, UNHANDLED, sizeof UNHANDLED - 1))
        return -1;
    return (long)head;
}

static int stat_line(const char *p, size_t n, Row *row) {
    if (n < 150 || n > MAX_LINE || p[n - 1] != '%') return 0;
    long found = head_length(p, n);
    if (found < 0) return 0;
    size_t head = (size_t)found;
    if (!canonical_tail(p + head, p + n, row)) return 0;
    engine_index(p, head, row);
    owner(p, head, row);
    vllm_time(p, head, row);
    time_of_day(p, head, row);
    return 1;
}

/* The picked lines read natively (`picked_line`, below): detect.evidence_lines columns. */
typedef struct {
    Buf idx, tod, ldt, ldt_valid;
    Strings text, msg, prefix, task, pid, ip, rank, kind, actor;
    size_t rows;
} Picked;

typedef struct {
    Buf rest_idx, idx, start, stop, numbers[6], tod, tod_valid;
    Strings index, pid, ip, vts;
    size_t rows;
    size_t n_lines;
    size_t rest_len;
    size_t dropped;
    Picked picked;
} Out;

static Strings *picked_strings(Picked *p, int i) {
    Strings *all[] = {&p->text, &p->msg, &p->prefix, &p->task, &p->pid,
                      &p->ip,   &p->rank, &p->kind,  &p->actor};
    return all[i];
}
#define N_PICKED_STRINGS 9

static void out_free(Out *o) {
    free(o->rest_idx.data);
    free(o->idx.data);
    free(o->start.data);
    free(o->stop.data);
    for (int i = 0; i < 6; i++) free(o->numbers[i].data);
    free(o->tod.data);
    free(o->tod_valid.data);
    strings_free(&o->index);
    strings_free(&o->pid);
    strings_free(&o->ip);
    strings_free(&o->vts);
    Picked *p = &o->picked;
    free(p->idx.data);
    free(p->tod.data);
    free(p->ldt.data);
    free(p->ldt_valid.data);
    for (int i = 0; i < N_PICKED_STRINGS; i++) strings_free(picked_strings(p, i));
}

static int add_row(Out *o, uint32_t line, int64_t start, int64_t stop, const Row *row) {
    size_t n = o->rows++;
    int64_t tod = row->tod_valid ? row->tod : 0;
    if (buf_put(&o->idx, &line, sizeof line) < 0 || buf_put(&o->start, &start, sizeof start) < 0 ||
        buf_put(&o->stop, &stop, sizeof stop) < 0 || buf_put(&o->tod, &tod, sizeof tod) < 0 ||
        bit_put(&o->tod_valid, n, row->tod_valid) < 0)
        return -1;
    for (int i = 0; i < 6; i++) {
        if (buf_put(&o->numbers[i], &row->numbers[i], sizeof(double)) < 0) return -1;
    }
    if (strings_add(&o->index, n, row->index, row->index_len, 1) < 0) return -1;
    if (strings_add(&o->pid, n, row->pid, row->pid ? row->pid_len : 0, row->pid != NULL) < 0)
        return -1;
    if (strings_add(&o->ip, n, row->ip, row->ip ? row->ip_len : 0, row->ip != NULL) < 0)
        return -1;
    return strings_add(&o->vts, n, row->vts, row->vts ? 14 : 0, row->vts != NULL);
}

/* ---- Which rest lines the polars path can need (the others are only counted).
 *
 * The polars path reads a rest line only when it holds a flag literal (detect._FLAG_LITERALS,
 * handed over by `rules`), lies in a window (the first lines of a read, the lines after a
 * traceback or Ray unhandled-error literal), is among the lines the summary head reads, or is
 * rewritten before its flags are searched or cut. A line is kept (copied into `rest`) when any
 * of these may hold; a superset is harmless (polars decides on those lines exactly as before). */

#define MAX_LITERALS 1024
#define MAX_LITERAL 1024

typedef struct {
    const char *data;
    size_t len;
} Lit;

/* A set of literals to search for (each at least 2 bytes). */
typedef struct {
    uint64_t pairs[1024];            /* bit (a | b << 8): some literal starts with bytes a, b */
    uint16_t first[257];             /* literals starting with byte c: lits[first[c]:first[c+1]] */
    Lit lits[MAX_LITERALS];          /* sorted by first byte */
    size_t n_lits;
    /* The vector prefilter (the Teddy idea of Hyperscan): 8 buckets of literals; bit b of
     * lo[j][x] (hi[j][x]) is set when a literal of bucket b has low (high) nibble x at its byte
     * j. A position is a candidate when its 3 bytes pass for one bucket. */
    uint8_t lo[3][16], hi[3][16];
    int vector;                      /* the CPU has AVX2 */
} LitSet;

#define MAX_KINDS 32

typedef struct {
    LitSet flags;                    /* a line holding one of these may be picked: kept */
    LitSet classes;                  /* a message holding one of these is not read natively */
    Lit blocks[2];                   /* the literals that open a traceback window */
    size_t n_blocks;
    size_t window;                   /* a block literal keeps its line and `window` lines after */
    size_t first_lines;              /* the first lines of a read are always kept */
    size_t long_line;                /* a line this long may be cut: kept */
    Lit kinds[MAX_KINDS];            /* a strict line whose message starts with kinds[i] ... */
    Lit kind_names[MAX_KINDS];       /* ... is read natively, of kind kind_names[i] */
    size_t n_kinds;
    char *storage;
} Rules;

static void rules_free(Rules *r) {
    if (!r) return;
    free(r->storage);
    free(r);
}

static void rules_capsule_free(PyObject *capsule) {
    rules_free(PyCapsule_GetPointer(capsule, "fastscan_rules"));
}

/* Whether a literal starts at p[i] (and ends within p[:n]): those of its first byte. */
static int literal_at(const LitSet *r, const unsigned char *p, size_t n, size_t i) {
    for (size_t k = r->first[p[i]]; k < r->first[p[i] + 1]; k++) {
        const Lit *lit = &r->lits[k];
        if (lit->len <= n - i && memcmp(p + i, lit->data, lit->len) == 0) return 1;
    }
    return 0;
}

/* Whether [p, p + n) holds one of the literals (each at least 2 bytes), from position `i` on:
 * a bitmap of their first two bytes, then those of the first byte compared. */
static int holds_literal_scalar(const LitSet *r, const unsigned char *p, size_t n, size_t i) {
    for (; i + 1 < n; i++) {
        unsigned pair = (unsigned)p[i] | ((unsigned)p[i + 1] << 8);
        if (((r->pairs[pair >> 6] >> (pair & 63)) & 1) && literal_at(r, p, n, i)) return 1;
    }
    return 0;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define VECTOR 1

/* holds_literal with AVX2: 32 positions at a time through the Teddy masks. Reads up to p[avail)
 * (the bytes after the line in the read), so a block may run past the line's end; candidates
 * past it are ignored. A candidate is checked against the bitmap of the literals' first two
 * bytes, then against the literals of its first byte. */
__attribute__((target("avx2"))) static int holds_literal_avx2(const LitSet *r,
                                                              const unsigned char *p, size_t n,
                                                              size_t avail) {
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    __m256i lo[3], hi[3];
    for (int j = 0; j < 3; j++) {
        lo[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)r->lo[j]));
        hi[j] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)r->hi[j]));
    }
    size_t i = 0;
    for (; i + 1 < n && i + 34 <= avail; i += 32) {
        __m256i hits = _mm256_set1_epi8((char)0xff);
        for (int j = 0; j < 3; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(p + i + j));
            __m256i l = _mm256_shuffle_epi8(lo[j], _mm256_and_si256(v, nibble));
            __m256i h = _mm256_shuffle_epi8(hi[j], _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble));
            hits = _mm256_and_si256(hits, _mm256_and_si256(l, h));
        }
        uint32_t mask = ~(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(hits, _mm256_setzero_si256()));
        if (!mask) continue;
        for (; mask; mask &= mask - 1) {
            size_t at = i + (size_t)__builtin_ctz(mask);
            if (at + 1 >= n) break; /* past the line: later bits are too */
            unsigned pair = (unsigned)p[at] | ((unsigned)p[at + 1] << 8);
            if (((r->pairs[pair >> 6] >> (pair & 63)) & 1) && literal_at(r, p, n, at)) return 1;
        }
    }
    return holds_literal_scalar(r, p, n, i);
}
#endif

/* Whether [p, p + n) holds one of the literals; `avail` bytes from p may be read. */
static int holds_literal(const LitSet *r, const unsigned char *p, size_t n, size_t avail) {
#ifdef VECTOR
    if (r->vector) return holds_literal_avx2(r, p, n, avail);
#endif
    (void)avail;
    return holds_literal_scalar(r, p, n, 0);
}

/* Teddy masks of the literals in their buckets (0-7, given by native.buckets). A literal of 2 bytes passes any third byte. */
static void teddy(LitSet *r, const Lit *lits, const uint8_t *bucket_of, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned b = bucket_of[i];
        for (size_t j = 0; j < 3; j++) {
            for (unsigned x = 0; x < 16; x++) {
                unsigned c = j < lits[i].len ? (unsigned char)lits[i].data[j] : 256;
                if (c == 256 || (c & 15) == x) r->lo[j][x] |= (uint8_t)(1u << b);
                if (c == 256 || (c >> 4) == x) r->hi[j][x] |= (uint8_t)(1u << b);
            }
        }
    }
#ifdef VECTOR
    __builtin_cpu_init();
    r->vector = r->vector && __builtin_cpu_supports("avx2");
#endif
}

/* Strict UTF-8 (what polars' `utf8` read accepts): no overlong form, surrogate or value past
 * U+10FFFF. */
static int valid_utf8(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint64_t word;
        if (n - i >= 8 && (memcpy(&word, s + i, 8), !(word & UINT64_C(0x8080808080808080)))) {
            i += 8; /* eight ASCII bytes */
            continue;
        }
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t more;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf) more = 1;
        else if (c == 0xe0) more = 2, lo = 0xa0;
        else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) more = 2;
        else if (c == 0xed) more = 2, hi = 0x9f;
        else if (c == 0xf0) more = 3, lo = 0x90;
        else if (c >= 0xf1 && c <= 0xf3) more = 3;
        else if (c == 0xf4) more = 3, hi = 0x8f;
        else return 0;
        if (n - i <= more) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t k = 2; k <= more; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
        }
        i += more + 1;
    }
    return 1;
}

/* What the rules need to know of a rest line. */
enum { HAS_NUL = 1, HAS_CR = 2, HAS_HIGH = 4, HAS_PRINTABLE = 8 };

static unsigned byte_classes(const unsigned char *p, size_t n) {
    uint8_t nul = 0, cr = 0, high = 0, printable = 0; /* bytes: the loop stays in byte lanes */
    for (size_t i = 0; i < n; i++) {                  /* no early exit: vectorised */
        uint8_t c = p[i];
        nul |= (uint8_t)(c == 0);
        cr |= (uint8_t)(c == '\r');
        high |= (uint8_t)(c >> 7);
        printable |= (uint8_t)((uint8_t)(c - 0x21) < 0x5e);
    }
    return (unsigned)(nul * HAS_NUL | cr * HAS_CR | high * HAS_HIGH | printable * HAS_PRINTABLE);
}

/* Per read: the line up to which every rest line is kept, and whether the read's first
 * non-blank rest line is still ahead (every rest line is kept up to it). */
typedef struct {
    size_t keep_until;
    int before_content;
} Keep;

/* Whether rest line `line` ([p, p + n), no newline) must reach the polars path. */
static int kept(const Rules *r, Keep *k, size_t line, const unsigned char *p, size_t n,
                size_t avail, int *flagged_out) {
    unsigned classes = byte_classes(p, n);
    int keep = line <= k->keep_until || k->before_content || n >= r->long_line ||
               (classes & (HAS_NUL | HAS_CR)) || ((classes & HAS_HIGH) && !valid_utf8(p, n));
    if (classes & HAS_PRINTABLE) k->before_content = 0;
    int flagged = holds_literal(&r->flags, p, n, avail);
    /* a block literal opens a window (NUL, blanked to a space before the search, might make one) */
    int block = classes & HAS_NUL;
    for (size_t b = 0; flagged && !block && b < r->n_blocks; b++)
        block = find((const char *)p, n, r->blocks[b].data, r->blocks[b].len) != NULL;
    if (block && line + r->window > k->keep_until) k->keep_until = line + r->window;
    *flagged_out = flagged && !block;
    return keep || flagged || block;
}

/* ---- Picked lines read natively: strict lines of the kinds in the rules.
 *
 * A rest line the polars path would pick as an interesting line and classify by a kind literal
 * opening its message (`Started: '`, `WANDB_MIRROR kind=`, ...: the rules' kinds, those
 * detect.NATIVE_KINDS proves safe) is read here when it is *strict*: printable ASCII besides
 * complete SGR colour codes, shorter than MAX_LINE and than a line that may be cut, an Iris
 * prefix `[HH:MM:SS] task=T | `, then Ray process prefixes `(Name pid=N, ip=X) ` (as
 * detect._PROCESS's first form reads them; a line with a prefix of another shape is not strict),
 * then an optional loguru header `YYYY-MM-DD HH:MM:SS.mmm | LEVEL | where - ` (a valid date and
 * time, three fraction digits), then the message, opening with a kind literal. It must hold a
 * flag literal (so it is picked), none of the stat and block literals (it is neither a stat line
 * nor a traceback start), no literal of the rules' `classes` in its message (so no error or
 * failure literal: detect.CLASS_LITERALS), and must not end with a space or `]` (Ray's
 * `[repeated Nx across cluster]` suffix). Its columns are those of detect.evidence_lines, with
 * detect's semantics (the leftmost match of each pattern on the line with its colour codes
 * removed). Any other line stays a rest line, for the polars path. */

typedef struct {
    const char *s; /* the line without its colour codes */
    size_t n;
    size_t outer;  /* detect._OUTER's match: s[:outer] */
    size_t header; /* detect._HEADER's match: s[outer:outer + header] */
    size_t task_at, task_len;
    int32_t tod;
    int ldt_valid;
    int64_t ldt; /* microseconds since 1970, UTC */
    const Lit *kind;
} PickedRow;

/* `s` without SGR codes (`\x1b\[[0-9;]*m`) into `out` (room for n bytes): its length, or -1 when
 * a byte is not printable ASCII outside a complete code. */
static long without_sgr(const char *s, size_t n, char *out) {
    uint8_t bad = 0; /* a byte neither printable ASCII nor ESC (no early exit: vectorised) */
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        bad |= (uint8_t)((uint8_t)(c - 0x20) > 0x5e) & (uint8_t)(c != 0x1b);
    }
    if (bad) return -1;
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        const char *esc = memchr(s + i, 0x1b, n - i);
        size_t stop = esc ? (size_t)(esc - s) : n;
        memcpy(out + m, s + i, stop - i);
        m += stop - i;
        if (!esc) break;
        size_t j = stop + 1;
        if (j >= n || s[j] != '[') return -1; /* an ESC outside a code */
        for (j++; j < n && (is_digit(s[j]) || s[j] == ';');) j++;
        if (j >= n || s[j] != 'm') return -1;
        i = j + 1;
    }
    return (long)m;
}

/* The end of `[^\s()]+` from `i` (ASCII without control bytes: \s is the space). */
static size_t run_no_paren(const char *s, size_t n, size_t i) {
    while (i < n && s[i] != ' ' && s[i] != '(' && s[i] != ')') i++;
    return i;
}

/* `pid=\d+(?:, ip=[^\s()]+)?\)` at `i`: its end, or 0. */
static size_t ray_owner(const char *s, size_t n, size_t i) {
    if (n - i < 6 || memcmp(s + i, "pid=", 4) != 0 || !is_digit(s[i + 4])) return 0;
    size_t q = i + 4;
    while (q < n && is_digit(s[q])) q++;
    if (n - q >= 5 && memcmp(s + q, ", ip=", 5) == 0) {
        size_t r = run_no_paren(s, n, q + 5);
        if (r > q + 5 && r < n && s[r] == ')') return r + 1;
    }
    return q < n && s[q] == ')' ? q + 1 : 0;
}

/* detect._PROCESS's first form, `\((?:[^\s()]+ )?pid=...\)`, at `i` (s[i] is `(`): its end
 * (before the optional space), or 0. */
static size_t ray_process(const char *s, size_t n, size_t i) {
    size_t r = run_no_paren(s, n, i + 1);
    if (r > i + 1 && r < n && s[r] == ' ') {
        size_t end = ray_owner(s, n, r + 1);
        if (end) return end;
    }
    return ray_owner(s, n, i + 1);
}

static int two_digits(const char *s, int *out) {
    if (!is_digit(s[0]) || !is_digit(s[1])) return 0;
    *out = (s[0] - '0') * 10 + (s[1] - '0');
    return 1;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian; H. Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int y, int m) {
    static const int days[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return days[m - 1] + (m == 2 && leap);
}

/* detect._HEADER's loguru form at s[i:]: its length (0: none; -1: a start of one that is not
 * strict), its time in *row. The date must be valid with three fraction digits. */
static long loguru_header(const char *s, size_t n, size_t i, PickedRow *row) {
    static const char shape[] = "dddd-dd-dd dd:dd:dd.ddd |";
    size_t m = sizeof shape - 1;
    if (i >= n || !is_digit(s[i])) return 0;
    if (n - i < m + 4) return -1;
    for (size_t k = 0; k < m; k++) {
        if (shape[k] == 'd' ? !is_digit(s[i + k]) : s[i + k] != shape[k]) return -1;
    }
    const char *t = s + i; /* digits where the shape has them */
#define DD(k) ((t[k] - '0') * 10 + (t[(k) + 1] - '0'))
    int year = DD(0) * 100 + DD(2), mo = DD(5), d = DD(8), h = DD(11), mi = DD(14), se = DD(17);
    int millis = DD(20) * 10 + (t[22] - '0');
#undef DD
    if (year < 1000 || mo < 1 || mo > 12 || d < 1 || d > days_in_month(year, mo) || h > 23 ||
        mi > 59 || se > 59)
        return -1;
    /* ` \| *[A-Z]+ *\| \S+ - ?` from the ` |` */
    size_t q = i + m;
    while (q < n && s[q] == ' ') q++;
    size_t level = q;
    while (q < n && s[q] >= 'A' && s[q] <= 'Z') q++;
    if (q == level) return -1;
    while (q < n && s[q] == ' ') q++;
    if (n - q < 2 || s[q] != '|' || s[q + 1] != ' ') return -1;
    q += 2;
    size_t where = q;
    while (q < n && s[q] != ' ') q++;
    if (q == where || n - q < 2 || s[q + 1] != '-') return -1;
    q += 2;
    if (q < n && s[q] == ' ') q++;
    int64_t days = days_from_civil(year, mo, d);
    row->ldt = ((days * 86400 + h * 3600 + mi * 60 + se) * 1000 + millis) * 1000;
    row->ldt_valid = 1;
    return (long)(q - i);
}

/* detect._OUTER of a strict line: the Iris prefix and Ray process prefixes; 0 when not strict. */
static size_t outer_prefix(const char *s, size_t n, PickedRow *row) {
    int h, m, sec;
    if (n < 20 || s[0] != '[' || s[3] != ':' || s[6] != ':' || memcmp(s + 9, "] task=", 7) != 0 ||
        !two_digits(s + 1, &h) || !two_digits(s + 4, &m) || !two_digits(s + 7, &sec))
        return 0;
    size_t q = 16;
    while (q < n && s[q] != ' ') q++;
    if (q == 16 || n - q < 2 || s[q + 1] != '|') return 0;
    row->task_at = 16;
    row->task_len = q - 16;
    row->tod = h * 3600 + m * 60 + sec;
    q += 2;
    if (q < n && s[q] == ' ') q++;
    while (q < n && s[q] == '(') {
        size_t end = ray_process(s, n, q);
        if (!end) return 0;
        q = end < n && s[end] == ' ' ? end + 1 : end;
    }
    /* _PROCESS's other forms (`[Name pid=N]`, `[rankN]:`, NCCL's `host:pid:tid [dev]`) cannot
     * match here when the line is strict: what follows must be a loguru header (digits, then
     * `-`) or a kind literal, and rules._native_kind admits none that could start them. */
    return q;
}

#define PICKED_BUF (MAX_LINE + 64)

/* Whether raw line [p, p + n) is a strict line of a kind; its fields in *row (`row->s` points into
 * `buf`, PICKED_BUF bytes, allocated once: the vector search may read past the line) if so. */
static int picked_line(const Rules *r, const char *p, size_t n, char *buf, PickedRow *row) {
    if (n >= MAX_LINE || n >= r->long_line) return 0;
    long m = without_sgr(p, n, buf);
    if (m < 20) return 0;
    const char *s = buf;
    size_t len = (size_t)m;
    if (s[len - 1] == ' ' || s[len - 1] == ']') return 0;
    row->ldt_valid = 0;
    size_t outer = outer_prefix(s, len, row);
    if (!outer) return 0;
    long header = loguru_header(s, len, outer, row);
    if (header < 0) return 0;
    const char *msg = s + outer + header;
    size_t msg_len = len - outer - (size_t)header;
    row->kind = NULL;
    for (size_t i = 0; i < r->n_kinds && !row->kind; i++) {
        if (msg_len >= r->kinds[i].len && memcmp(msg, r->kinds[i].data, r->kinds[i].len) == 0)
            row->kind = &r->kind_names[i];
    }
    /* (no block literal either: `kept` found none in a line it reports flagged) */
    if (!row->kind || find(p, n, LITERAL, sizeof LITERAL - 1)) return 0;
    size_t avail = PICKED_BUF - (size_t)(msg - buf);
    if (holds_literal(&r->classes, (const unsigned char *)msg, msg_len, avail)) return 0;
    row->s = s;
    row->n = len;
    row->outer = outer;
    row->header = (size_t)header;
    return 1;
}

/* The leftmost `needle` in s[:n] followed by a byte `ok` accepts: its position, or n. */
static size_t leftmost(const char *s, size_t n, const char *needle, int (*ok)(char)) {
    size_t m = strlen(needle);
    for (size_t i = 0; i + m < n; i++) {
        const char *hit = find(s + i, n - i, needle, m);
        if (!hit) return n;
        i = (size_t)(hit - s);
        if (i + m < n && ok(s[i + m])) return i;
    }
    return n;
}

static int ip_byte(char c) { return c != ' ' && c != '(' && c != ')' && c != ']'; }

static int add_picked(Picked *o, uint32_t line, const PickedRow *row) {
    size_t n = o->rows++;
    const char *s = row->s;
    size_t outer = row->outer, prefix = outer;
    while (prefix > 0 && s[prefix - 1] == ' ') prefix--;
    /* pid=(\d+), ip=([^\s()\]]+), \[rank\d+\] on the outer prefix: leftmost matches */
    size_t pid = leftmost(s, outer, "pid=", is_digit), pid_len = 0;
    if (pid < outer) {
        pid += 4;
        while (pid + pid_len < outer && is_digit(s[pid + pid_len])) pid_len++;
    }
    size_t ip = leftmost(s, outer, "ip=", ip_byte), ip_len = 0;
    if (ip < outer) {
        ip += 3;
        while (ip + ip_len < outer && ip_byte(s[ip + ip_len])) ip_len++;
    }
    size_t rank = outer, rank_len = 0;
    for (size_t i = leftmost(s, outer, "[rank", is_digit); i < outer;
         i = leftmost(s + i + 1, outer - i - 1, "[rank", is_digit) + i + 1) {
        size_t q = i + 5;
        while (q < outer && is_digit(s[q])) q++;
        if (q < outer && s[q] == ']') {
            rank = i;
            rank_len = q + 1 - i;
            break;
        }
    }
    const char *text = s + outer;
    size_t text_len = row->n - outer;
    if (buf_put(&o->idx, &line, sizeof line) < 0 || buf_put(&o->tod, &row->tod, 4) < 0 ||
        buf_put(&o->ldt, &row->ldt, 8) < 0 || bit_put(&o->ldt_valid, n, row->ldt_valid) < 0 ||
        strings_add(&o->text, n, text, text_len, 1) < 0 ||
        strings_add(&o->msg, n, text + row->header, text_len - row->header, 1) < 0 ||
        strings_add(&o->prefix, n, s, prefix, 1) < 0 ||
        strings_add(&o->task, n, s + row->task_at, row->task_len, 1) < 0 ||
        strings_add(&o->pid, n, s + pid, pid_len, pid < outer) < 0 ||
        strings_add(&o->ip, n, s + ip, ip_len, ip < outer) < 0 ||
        strings_add(&o->rank, n, s + rank, rank_len, rank < outer) < 0 ||
        strings_add(&o->kind, n, row->kind->data, row->kind->len, 1) < 0)
        return -1;
    /* actor: task|pid@ip rank (absent parts empty), its parts appended one by one (they may
     * overlap in the line: pid, ip and rank can lie inside the task) */
    const char *parts[6] = {s + row->task_at, "|", s + pid, "@", s + ip, s + rank};
    size_t lens[6] = {row->task_len,          1,
                      pid < outer ? pid_len : 0, 1,
                      ip < outer ? ip_len : 0,   rank < outer ? rank_len : 0};
    return strings_join(&o->actor, n, parts, lens, 6);
}

/* The bytes of `item` when it is bytes of `least` to MAX_LITERAL; else NULL, error set. */
static const char *literal_bytes(PyObject *item, Py_ssize_t least, size_t *len) {
    if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) < least ||
        PyBytes_GET_SIZE(item) > MAX_LITERAL) {
        PyErr_SetString(PyExc_ValueError, "a literal must be bytes of 2 (1 for a kind) to 1024");
        return NULL;
    }
    *len = (size_t)PyBytes_GET_SIZE(item);
    return PyBytes_AS_STRING(item);
}

/* Copy `src` into the storage at *into: its Lit. */
static Lit stored(char **into, const char *src, size_t len) {
    Lit lit = {*into, len};
    memcpy(*into, src, len);
    *into += len;
    return lit;
}

/* The literals of `tuple` (buckets 0-7 in `buckets`) as set `set`, copied into *into; -1 with
 * an error set when out of range. */
static int litset(LitSet *set, PyObject *tuple, const Py_buffer *buckets, char **into, int vector) {
    Py_ssize_t n = PyTuple_GET_SIZE(tuple);
    if (n > MAX_LITERALS || buckets->len != n) {
        PyErr_SetString(PyExc_ValueError, "rules out of range");
        return -1;
    }
    uint8_t bucket_of[MAX_LITERALS];
    if (n) memcpy(bucket_of, buckets->buf, (size_t)n);
    Lit all[MAX_LITERALS];
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t m;
        const char *src = literal_bytes(PyTuple_GET_ITEM(tuple, i), 2, &m);
        if (!src) return -1;
        if (bucket_of[i] > 7) {
            PyErr_SetString(PyExc_ValueError, "rules out of range");
            return -1;
        }
        all[i] = stored(into, src, m);
    }
    /* counting sort by first byte */
    size_t count[257] = {0};
    for (Py_ssize_t i = 0; i < n; i++) count[(unsigned char)all[i].data[0] + 1]++;
    for (int c = 0; c < 256; c++) count[c + 1] += count[c];
    for (int c = 0; c <= 256; c++) set->first[c] = (uint16_t)count[c];
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *d = (const unsigned char *)all[i].data;
        set->lits[count[d[0]]++] = all[i];
        unsigned pair = (unsigned)d[0] | ((unsigned)d[1] << 8);
        set->pairs[pair >> 6] |= UINT64_C(1) << (pair & 63);
    }
    set->n_lits = (size_t)n;
    set->vector = vector;
    teddy(set, all, bucket_of, (size_t)n);
    return 0;
}

static size_t tuple_bytes(PyObject *tuple) {
    size_t total = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); i++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, i);
        if (PyTuple_Check(item)) total += tuple_bytes(item);
        else if (PyBytes_Check(item)) total += (size_t)PyBytes_GET_SIZE(item);
    }
    return total;
}

/* rules(literals, buckets, blocks, window, first_lines, long_line, vector=True, classes=(),
 * class_buckets=b"", kinds=()): the rules as a capsule. `kinds`: (literal, kind) pairs. */
static PyObject *rules(PyObject *self, PyObject *args) {
    Py_buffer buckets = {0}, class_buckets = {0};
    PyObject *literals, *blocks, *classes = NULL, *kinds = NULL;
    Py_ssize_t window, first_lines, long_line;
    int vector = 1;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!y*O!nnn|pO!y*O!", &PyTuple_Type, &literals, &buckets,
                          &PyTuple_Type, &blocks, &window, &first_lines, &long_line, &vector,
                          &PyTuple_Type, &classes, &class_buckets, &PyTuple_Type, &kinds))
        return NULL;
    PyObject *none = PyTuple_New(0);
    Rules *r = calloc(1, sizeof *r);
    Py_ssize_t nb = PyTuple_GET_SIZE(blocks), nk = kinds ? PyTuple_GET_SIZE(kinds) : 0;
    size_t total = tuple_bytes(literals) + tuple_bytes(blocks) +
                   (classes ? tuple_bytes(classes) : 0) + (kinds ? tuple_bytes(kinds) : 0);
    int failed = !none || !r || !(r->storage = malloc(total + 1));
    if (failed) PyErr_NoMemory();
    if (!failed && (nb > 2 || nk > MAX_KINDS || window < 0 || first_lines < 0 || long_line < 1)) {
        PyErr_SetString(PyExc_ValueError, "rules out of range");
        failed = 1;
    }
    char *into = failed ? NULL : r->storage;
    failed = failed || litset(&r->flags, literals, &buckets, &into, vector) < 0 ||
             litset(&r->classes, classes ? classes : none, &class_buckets, &into, vector) < 0;
    for (Py_ssize_t i = 0; !failed && i < nb; i++) {
        size_t m;
        const char *src = literal_bytes(PyTuple_GET_ITEM(blocks, i), 2, &m);
        if (src) r->blocks[r->n_blocks++] = stored(&into, src, m);
        failed = !src;
    }
    for (Py_ssize_t i = 0; !failed && i < nk; i++) {
        PyObject *pair = PyTuple_GET_ITEM(kinds, i);
        size_t m, k;
        const char *lit = NULL, *name = NULL;
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "a kind is a (literal, name) pair");
        } else if ((lit = literal_bytes(PyTuple_GET_ITEM(pair, 0), 1, &m)) &&
                   (name = literal_bytes(PyTuple_GET_ITEM(pair, 1), 1, &k))) {
            r->kinds[r->n_kinds] = stored(&into, lit, m);
            r->kind_names[r->n_kinds++] = stored(&into, name, k);
        }
        failed = !name;
    }
    Py_XDECREF(none);
    PyBuffer_Release(&buckets);
    if (class_buckets.obj) PyBuffer_Release(&class_buckets);
    if (failed) {
        rules_free(r);
        return NULL;
    }
    r->window = (size_t)window;
    r->first_lines = (size_t)first_lines;
    r->long_line = (size_t)long_line;
    PyObject *capsule = PyCapsule_New(r, "fastscan_rules", rules_capsule_free);
    if (!capsule) rules_free(r);
    return capsule;
}

/* The pass: lines of data[:end]; rest lines copied into `rest` (room for `end` bytes), all of
 * them without `r`, else only those the rules keep (the others counted in o->dropped). With
 * kinds in `r`, a strict line of one (`picked_line`) after the read's first lines and after its
 * first rest line with a printable byte (the summary head reads those) is read here. */
static int pass(const char *data, size_t end, char *rest, Out *o, const Rules *r) {
    size_t at = 0, line = 0;
    Keep k = {r && r->first_lines ? r->first_lines - 1 : 0, 1};
    char *buf = r && r->n_kinds ? calloc(1, PICKED_BUF) : NULL;
    if (r && r->n_kinds && !buf) return -1;
    int failed = 0;
    while (at < end && !failed) {
        const char *nl = memchr(data + at, '\n', end - at);
        size_t stop = nl ? (size_t)(nl - data) : end;
        size_t next = nl ? stop + 1 : end;
        Row row;
        PickedRow picked;
        if (line > UINT32_MAX) {
            failed = 1;
            break;
        }
        if (stat_line(data + at, stop - at, &row)) {
            failed = add_row(o, (uint32_t)line, (int64_t)at, (int64_t)stop, &row) < 0;
        } else {
            int flagged = 0, before_content = k.before_content;
            int keep = !r || kept(r, &k, line, (const unsigned char *)data + at, stop - at,
                                  end - at, &flagged);
            if (flagged && buf && line >= r->first_lines && !before_content &&
                picked_line(r, data + at, stop - at, buf, &picked)) {
                failed = add_picked(&o->picked, (uint32_t)line, &picked) < 0;
            } else if (keep) {
                uint32_t where = (uint32_t)line;
                memcpy(rest + o->rest_len, data + at, next - at);
                o->rest_len += next - at;
                failed = buf_put(&o->rest_idx, &where, sizeof where) < 0;
            } else {
                o->dropped++;
            }
        }
        at = next;
        line++;
    }
    free(buf);
    o->n_lines = line;
    return failed ? -1 : 0;
}

/* ---- Arrow C data interface (https://arrow.apache.org/docs/format/CDataInterface.html):
 * the columns leave as PyCapsules that polars imports without a copy. */

#define ARROW_FLAG_NULLABLE 2

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#define N_COLUMNS 12
static const char *const NAMES[N_COLUMNS] = {"idx",    "index",      "pid",     "ip",
                                             "vts",    "tod",        "prompt",  "generation",
                                             "running", "waiting",   "kv",      "hit"};
static const char *const FORMATS[N_COLUMNS] = {"I", "u", "u", "u", "u", "l",
                                               "g", "g", "g", "g", "g", "g"};
/* The picked lines' columns (detect.evidence_lines's but the constant ones). */
#define N_PICKED 12
static const char *const PICKED_NAMES[N_PICKED] = {"idx", "text", "msg", "prefix", "task", "tod",
                                                   "pid", "ip",   "rank", "ldt",   "kind", "actor"};
static const char *const PICKED_FORMATS[N_PICKED] = {"I", "u", "u", "u", "u", "i",
                                                     "u", "u", "u", "tsu:UTC", "u", "u"};
/* The arrays: the stat columns and their struct, `where`, the picked columns and their struct. */
#define WHERE (N_COLUMNS + 1)
#define PICKED (WHERE + 1)
#define N_ARRAYS (PICKED + N_PICKED + 1)

/* What the exported arrays point into; freed when the last of them is released (polars may
 * release them from any thread: the count is atomic). */
typedef struct {
    Out out;
    int refs;
    const void *buffers[N_ARRAYS][3];
    struct ArrowArray arrays[N_ARRAYS];
    struct ArrowArray *children[N_COLUMNS + N_PICKED];
} Holder;

/* Schemas: one block each, children released with their parent. */
#define MAX_CHILDREN (N_COLUMNS > N_PICKED ? N_COLUMNS : N_PICKED)
typedef struct {
    struct ArrowSchema parent;
    struct ArrowSchema columns[MAX_CHILDREN];
    struct ArrowSchema *children[MAX_CHILDREN];
} SchemaBlock;

static void schema_child_release(struct ArrowSchema *schema) { schema->release = NULL; }

static void schema_release(struct ArrowSchema *schema) {
    for (int64_t i = 0; i < schema->n_children; i++) {
        if (schema->children[i]->release) schema->children[i]->release(schema->children[i]);
    }
    schema->release = NULL;
    free(schema->private_data);
}

static void holder_drop(Holder *h) {
    if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        out_free(&h->out);
        free(h);
    }
}

static void array_release(struct ArrowArray *array) {
    for (int64_t i = 0; i < array->n_children; i++) {
        if (array->children[i]->release) array->children[i]->release(array->children[i]);
    }
    array->release = NULL;
    holder_drop((Holder *)array->private_data);
}

static int64_t nulls(const Buf *bitmap, size_t rows) {
    int64_t valid = 0;
    for (size_t i = 0; i < rows; i++) valid += (bitmap->data[i / 8] >> (i % 8)) & 1;
    return (int64_t)rows - valid;
}

static void column(Holder *h, int k, size_t rows, const Buf *bitmap, const Buf *a, const Buf *b) {
    struct ArrowArray *array = &h->arrays[k];
    int64_t null_count = bitmap ? nulls(bitmap, rows) : 0;
    h->buffers[k][0] = null_count ? bitmap->data : NULL;
    h->buffers[k][1] = a->data;
    h->buffers[k][2] = b ? b->data : NULL;
    memset(array, 0, sizeof *array);
    array->length = (int64_t)rows;
    array->null_count = null_count;
    array->n_buffers = b ? 3 : 2;
    array->buffers = h->buffers[k];
    array->release = array_release;
    array->private_data = h;
    h->refs++;
}

static void capsule_schema(PyObject *capsule) {
    struct ArrowSchema *schema = PyCapsule_GetPointer(capsule, "arrow_schema");
    if (schema && schema->release) schema->release(schema);
    free(schema);
}

static void capsule_array(PyObject *capsule) {
    struct ArrowArray *array = PyCapsule_GetPointer(capsule, "arrow_array");
    if (array && array->release) array->release(array);
    free(array);
}

/* A (schema, array) pair of capsules; `array` is moved into the capsule's own struct. */
static PyObject *capsules(struct ArrowSchema *schema, struct ArrowArray *array) {
    struct ArrowArray *moved = malloc(sizeof *moved);
    PyObject *s = NULL, *a = NULL;
    if (!moved) {
        array->release(array);
        schema->release(schema);
        free(schema);
        return PyErr_NoMemory();
    }
    *moved = *array;
    array->release = NULL;
    s = PyCapsule_New(schema, "arrow_schema", capsule_schema);
    if (!s) {
        schema->release(schema);
        free(schema);
    }
    a = PyCapsule_New(moved, "arrow_array", capsule_array);
    if (!a) {
        moved->release(moved);
        free(moved);
    }
    if (!s || !a) {
        Py_XDECREF(s);
        Py_XDECREF(a);
        return NULL;
    }
    return Py_BuildValue("(NN)", s, a);
}

/* A struct of `n` columns. */
static struct ArrowSchema *struct_schema(const char *const *names, const char *const *formats,
                                          int n) {
    SchemaBlock *block = calloc(1, sizeof *block);
    if (!block) return NULL;
    for (int k = 0; k < n; k++) {
        struct ArrowSchema *c = &block->columns[k];
        c->format = formats[k];
        c->name = names[k];
        c->flags = ARROW_FLAG_NULLABLE;
        c->release = schema_child_release;
        block->children[k] = c;
    }
    block->parent.format = "+s";
    block->parent.name = "";
    block->parent.n_children = n;
    block->parent.children = block->children;
    block->parent.release = schema_release;
    block->parent.private_data = block;
    struct ArrowSchema *out = malloc(sizeof *out);
    if (!out) {
        free(block);
        return NULL;
    }
    /* the capsule frees `out`; the block (children) is freed by the release callback */
    *out = block->parent;
    return out;
}

static struct ArrowSchema *where_schema(void) {
    struct ArrowSchema *schema = calloc(1, sizeof *schema);
    if (!schema) return NULL;
    schema->format = "I";
    schema->name = "idx";
    schema->release = schema_release; /* no children; frees private_data (NULL) */
    return schema;
}

/* Every buffer at least 8 bytes (no NULL data pointer, even for no rows). */
static int out_ready(Out *o) {
    Picked *p = &o->picked;
    Buf *bufs[] = {&o->rest_idx, &o->idx, &o->tod, &o->tod_valid,
                   &p->idx,      &p->tod, &p->ldt, &p->ldt_valid};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        if (buf_reserve(bufs[i], 8) < 0) return -1;
    }
    for (int i = 0; i < 6; i++) {
        if (buf_reserve(&o->numbers[i], 8) < 0) return -1;
    }
    Strings *strs[4 + N_PICKED_STRINGS] = {&o->index, &o->pid, &o->ip, &o->vts};
    for (int i = 0; i < N_PICKED_STRINGS; i++) strs[4 + i] = picked_strings(p, i);
    for (int i = 0; i < 4 + N_PICKED_STRINGS; i++) {
        if (buf_reserve(&strs[i]->chars, 8) < 0 || buf_reserve(&strs[i]->valid, 8) < 0)
            return -1;
        buf_fit(&strs[i]->chars);
        buf_fit(&strs[i]->offsets);
    }
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) buf_fit(bufs[i]);
    for (int i = 0; i < 6; i++) buf_fit(&o->numbers[i]);
    return 0;
}

/* arrays[k] as a struct of the `n` arrays from arrays[first] (children from children[child]). */
static void struct_array(Holder *h, int k, int first, int n, int child, size_t rows) {
    static const void *no_validity[1] = {NULL};
    struct ArrowArray *parent = &h->arrays[k];
    memset(parent, 0, sizeof *parent);
    for (int i = 0; i < n; i++) h->children[child + i] = &h->arrays[first + i];
    parent->length = (int64_t)rows;
    parent->n_buffers = 1;
    parent->buffers = no_validity;
    parent->n_children = n;
    parent->children = &h->children[child];
    parent->release = array_release;
    parent->private_data = h;
    h->refs++;
}

/* The stats columns and `where` (from `h`), the picked columns (from `hp`, which holds only
 * them: polars may let them go before the stats), as capsule pairs; both holders are consumed. */
static PyObject *export(Holder *h, Holder *hp) {
    Out *o = &h->out;
    Picked *p = &hp->out.picked;
    size_t rows = o->rows;
    h->refs = 1; /* held while exporting */
    hp->refs = 1;
    column(h, 0, rows, NULL, &o->idx, NULL);
    Strings *strs[] = {&o->index, &o->pid, &o->ip, &o->vts};
    for (int i = 0; i < 4; i++) column(h, 1 + i, rows, &strs[i]->valid, &strs[i]->offsets, &strs[i]->chars);
    column(h, 5, rows, &o->tod_valid, &o->tod, NULL);
    for (int i = 0; i < 6; i++) column(h, 6 + i, rows, NULL, &o->numbers[i], NULL);
    struct_array(h, N_COLUMNS, 0, N_COLUMNS, 0, rows);
    column(h, WHERE, o->rest_idx.len / 4, NULL, &o->rest_idx, NULL);
    /* picked: idx, text, msg, prefix, task, tod, pid, ip, rank, ldt, kind, actor */
    Strings *ps[N_PICKED] = {NULL, &p->text, &p->msg, &p->prefix, &p->task, NULL,
                             &p->pid, &p->ip, &p->rank, NULL, &p->kind, &p->actor};
    for (int i = 0; i < N_PICKED; i++) {
        const Buf *data = i == 0 ? &p->idx : i == 5 ? &p->tod : &p->ldt;
        if (ps[i]) column(hp, PICKED + i, p->rows, &ps[i]->valid, &ps[i]->offsets, &ps[i]->chars);
        else column(hp, PICKED + i, p->rows, i == 9 ? &p->ldt_valid : NULL, data, NULL);
    }
    struct_array(hp, PICKED + N_PICKED, PICKED, N_PICKED, N_COLUMNS, p->rows);
    holder_drop(h); /* the arrays hold them now */
    holder_drop(hp);
    struct ArrowSchema *s1 = struct_schema(NAMES, FORMATS, N_COLUMNS);
    struct ArrowSchema *s2 = where_schema();
    struct ArrowSchema *s3 = struct_schema(PICKED_NAMES, PICKED_FORMATS, N_PICKED);
    if (!s1 || !s2 || !s3) {
        h->arrays[N_COLUMNS].release(&h->arrays[N_COLUMNS]);
        h->arrays[WHERE].release(&h->arrays[WHERE]);
        hp->arrays[PICKED + N_PICKED].release(&hp->arrays[PICKED + N_PICKED]);
        struct ArrowSchema *schemas[] = {s1, s3};
        for (int i = 0; i < 2; i++) {
            if (schemas[i]) {
                schemas[i]->release(schemas[i]);
                free(schemas[i]);
            }
        }
        free(s2);
        return PyErr_NoMemory();
    }
    PyObject *stats = capsules(s1, &h->arrays[N_COLUMNS]);
    PyObject *where = capsules(s2, &h->arrays[WHERE]);
    PyObject *picked = capsules(s3, &hp->arrays[PICKED + N_PICKED]);
    if (!stats || !where || !picked) {
        Py_XDECREF(stats);
        Py_XDECREF(where);
        Py_XDECREF(picked);
        return NULL;
    }
    return Py_BuildValue("(NNN)", stats, where, picked);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t end;
    PyObject *rules_obj = Py_None;
    const Rules *r = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n|O", &view, &end, &rules_obj)) return NULL;
    if (rules_obj != Py_None) {
        r = PyCapsule_GetPointer(rules_obj, "fastscan_rules");
        if (!r) {
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    if (end < 0 || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "end out of range");
        return NULL;
    }
    Holder *h = calloc(1, sizeof *h), *hp = calloc(1, sizeof *hp);
    if (!h || !hp) {
        free(h);
        free(hp);
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    Out *o = &h->out;
    PyObject *rest = PyBytes_FromStringAndSize(NULL, end);
    int failed = rest == NULL || strings_init(&o->index) < 0 || strings_init(&o->pid) < 0 ||
                 strings_init(&o->ip) < 0 || strings_init(&o->vts) < 0;
    for (int i = 0; !failed && i < N_PICKED_STRINGS; i++)
        failed = strings_init(picked_strings(&o->picked, i)) < 0;
    if (!failed) {
        char *into = PyBytes_AS_STRING(rest);
        Py_BEGIN_ALLOW_THREADS
        failed = pass((const char *)view.buf, (size_t)end, into, o, r) < 0 || out_ready(o) < 0;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    if (failed || _PyBytes_Resize(&rest, (Py_ssize_t)o->rest_len) < 0) {
        Py_XDECREF(rest);
        out_free(o);
        free(h);
        free(hp);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    PyObject *starts = PyBytes_FromStringAndSize(o->start.data ? o->start.data : "",
                                                 (Py_ssize_t)o->start.len);
    PyObject *stops = PyBytes_FromStringAndSize(o->stop.data ? o->stop.data : "",
                                                (Py_ssize_t)o->stop.len);
    Py_ssize_t n_lines = (Py_ssize_t)o->n_lines, rows = (Py_ssize_t)o->rows;
    Py_ssize_t dropped = (Py_ssize_t)o->dropped;
    hp->out.picked = o->picked; /* the picked columns get a holder of their own */
    memset(&o->picked, 0, sizeof o->picked);
    PyObject *columns = export(h, hp); /* consumes h and hp */
    if (!starts || !stops || !columns) {
        Py_XDECREF(rest);
        Py_XDECREF(starts);
        Py_XDECREF(stops);
        Py_XDECREF(columns);
        return NULL;
    }
    return Py_BuildValue("(nnNNNNn)", n_lines, rows, rest, starts, stops, columns, dropped);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(data, end, rules=None) -> the lines of data[:end], stat lines read."},
    {"rules", rules, METH_VARARGS,
     "rules(literals, buckets, blocks, window, first_lines, long_line, vector=True) -> which "
     "rest lines to keep (vector: AVX2 when the CPU has it)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastscan", "Native pass over the vLLM stat lines of a read.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastscan(void) {
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!c_locale) return PyErr_NoMemory();
    PyObject *m = PyModule_Create(&module);
    /* API 2: scan returns the picked lines too; rules takes `picked` */
    if (m && PyModule_AddIntConstant(m, "API", 2) < 0) Py_CLEAR(m);
    return m;
}
