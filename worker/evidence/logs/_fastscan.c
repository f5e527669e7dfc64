/* One native pass over a read of a log: split lines, read the strict vLLM stat lines.
 *
 * scan(data, end) looks at the lines of data[:end] (each ended by a newline; the last may not
 * be). A line is a *strict stat line* when it is at most MAX_LINE bytes of printable ASCII (or
 * ESC, for colour codes), holds "Avg prompt throughput", ends exactly with vLLM's canonical tail
 * (six plain numbers between fixed fragments, then '%'), and holds neither literal that opens a
 * traceback or Ray's unhandled-error block. For such a line it reads what the polars path of
 * worker/evidence/logs/engines.py reads, with the same semantics (the leftmost match of each of
 * its patterns on the part before the literal), so the values are identical. Every other line
 * is copied, byte for byte with its newline, into `rest`, for the polars path.
 *
 * Returns a tuple:
 *   n_lines, rows (stat lines read), rest (bytes), rest_idx (uint32 line index of each rest
 *   line), idx (uint32), start (int64 byte offset), stop (int64, newline excluded),
 *   prompt, generation, running, waiting, kv, hit (float64 each),
 *   tod (int64), tod_valid (bitmap),
 *   index (chars, int32 offsets, bitmap), pid (same), ip (same), vts (same)
 * Every array is a bytes object in Arrow's layout (native byte order; validity bitmaps least
 * significant bit first), so Python wraps them without a copy. Every read of the input is bounded by the
 * line it is in; the GIL is released during the pass.
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

static const char *find(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0 || n < m) return NULL;
    return memmem(hay, n, needle, m);
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
        if (memcmp(head + at, "pid=", 4) != 0 || !is_digit(head[at + 4])) continue;
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

/* The leftmost `(?:INFO|WARNING|DEBUG|ERROR) \d\d-\d\d \d\d:\d\d:\d\d`: its last 14 bytes. */
static void vllm_time(const char *head, size_t n, Row *row) {
    static const char *const levels[4] = {"INFO", "WARNING", "DEBUG", "ERROR"};
    row->vts = NULL;
    for (size_t at = 0; at < n; at++) {
        for (int k = 0; k < 4; k++) {
            size_t m = strlen(levels[k]);
            if (at + m + 15 > n || memcmp(head + at, levels[k], m) != 0) continue;
            if (head[at + m] == ' ' && clock_at(head + at + m + 1)) {
                row->vts = head + at + m + 1;
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
static int stat_line(const char *p, size_t n, Row *row) {
    if (n < 150 || n > MAX_LINE || p[n - 1] != '%') return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if ((c < 0x20 || c > 0x7e) && c != 0x1b) return 0;
    }
    const char *lit = find(p, n, LITERAL, sizeof LITERAL - 1);
    if (!lit) return 0;
    size_t head = (size_t)(lit - p);
    if (find(p, head, TRACEBACK, sizeof TRACEBACK - 1) ||
        find(p, head, UNHANDLED, sizeof UNHANDLED - 1))
        return 0;
    if (!canonical_tail(lit, p + n, row)) return 0;
    engine_index(p, head, row);
    owner(p, head, row);
    vllm_time(p, head, row);
    time_of_day(p, head, row);
    return 1;
}

typedef struct {
    Buf rest_idx, idx, start, stop, numbers[6], tod, tod_valid;
    Strings index, pid, ip, vts;
    size_t rows;
    size_t n_lines;
    size_t rest_len;
} Out;

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

/* The pass: lines of data[:end]; rest lines copied into `rest` (room for `end` bytes). */
static int pass(const char *data, size_t end, char *rest, Out *o) {
    size_t at = 0, line = 0;
    while (at < end) {
        const char *nl = memchr(data + at, '\n', end - at);
        size_t stop = nl ? (size_t)(nl - data) : end;
        size_t next = nl ? stop + 1 : end;
        Row row;
        if (line > UINT32_MAX) return -1;
        if (stat_line(data + at, stop - at, &row)) {
            if (add_row(o, (uint32_t)line, (int64_t)at, (int64_t)stop, &row) < 0) return -1;
        } else {
            uint32_t where = (uint32_t)line;
            memcpy(rest + o->rest_len, data + at, next - at);
            o->rest_len += next - at;
            if (buf_put(&o->rest_idx, &where, sizeof where) < 0) return -1;
        }
        at = next;
        line++;
    }
    o->n_lines = line;
    return 0;
}

static PyObject *as_bytes(const Buf *b) {
    return PyBytes_FromStringAndSize(b->data ? b->data : "", (Py_ssize_t)b->len);
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t end;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*n", &view, &end)) return NULL;
    if (end < 0 || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "end out of range");
        return NULL;
    }
    Out o;
    memset(&o, 0, sizeof o);
    PyObject *rest = PyBytes_FromStringAndSize(NULL, end);
    int failed = rest == NULL || strings_init(&o.index) < 0 || strings_init(&o.pid) < 0 ||
                 strings_init(&o.ip) < 0 || strings_init(&o.vts) < 0;
    if (!failed) {
        char *into = PyBytes_AS_STRING(rest);
        Py_BEGIN_ALLOW_THREADS
        failed = pass((const char *)view.buf, (size_t)end, into, &o) < 0;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&view);
    PyObject *result = NULL;
    if (!failed && _PyBytes_Resize(&rest, (Py_ssize_t)o.rest_len) == 0) {
        result = Py_BuildValue(
            "(nnNNNNNNNNNNNNNNNNNNNNNNNNN)", (Py_ssize_t)o.n_lines, (Py_ssize_t)o.rows, rest,
            as_bytes(&o.rest_idx), as_bytes(&o.idx), as_bytes(&o.start), as_bytes(&o.stop),
            as_bytes(&o.numbers[0]), as_bytes(&o.numbers[1]), as_bytes(&o.numbers[2]),
            as_bytes(&o.numbers[3]), as_bytes(&o.numbers[4]), as_bytes(&o.numbers[5]),
            as_bytes(&o.tod), as_bytes(&o.tod_valid), as_bytes(&o.index.chars),
            as_bytes(&o.index.offsets), as_bytes(&o.index.valid), as_bytes(&o.pid.chars), as_bytes(&o.pid.offsets),
            as_bytes(&o.pid.valid), as_bytes(&o.ip.chars), as_bytes(&o.ip.offsets),
            as_bytes(&o.ip.valid), as_bytes(&o.vts.chars), as_bytes(&o.vts.offsets),
            as_bytes(&o.vts.valid));
        rest = NULL; /* stolen by N (or freed by Py_BuildValue on failure) */
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    Py_XDECREF(rest);
    out_free(&o);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "scan(data, end) -> the lines of data[:end], stat lines read."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastscan", "Native pass over the vLLM stat lines of a read.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastscan(void) {
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (!c_locale) return PyErr_NoMemory();
    return PyModule_Create(&module);
}
