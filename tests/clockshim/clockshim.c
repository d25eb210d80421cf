/*
 * clockshim: an LD_PRELOAD library that shifts this process's wall clock by an offset read
 * from a file, for tests that step a PostgreSQL server's clock while it runs.
 *
 * Why not libfaketime: under PostgreSQL 15 it does not reach the processes the postmaster
 * starts from its signal handlers (background workers such as the snowflake registry worker
 * saw the real time, or a monotonic clock that disagreed with the backends'). This shim has
 * no state to set up per process: every call reads the offset from a shared mapping of the
 * file, made once and inherited across fork().
 *
 * SNOWFLAKE_CLOCK_OFFSET_FILE names the file: 32 bytes, a signed decimal number of
 * milliseconds padded with spaces, rewritten in place (same size) to move the clock. Only
 * CLOCK_REALTIME and CLOCK_REALTIME_COARSE move (a real clock step, by NTP or an operator,
 * moves those alone), and gettimeofday() and time(), which glibc serves without calling
 * clock_gettime().
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define OFFSET_FILE_BYTES 32

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*gettimeofday_fn)(struct timeval *, void *);

static const char *volatile mapping;
static volatile int mapping_tried;

/* The shared view of the offset file, mapped at the first call (NULL: no file). */
static const char *offset_view(void)
{
    if (!mapping_tried) {
        const char *path = getenv("SNOWFLAKE_CLOCK_OFFSET_FILE");
        mapping_tried = 1;
        if (path) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *p = mmap(NULL, OFFSET_FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
                close(fd);
                if (p != MAP_FAILED)
                    mapping = p;
            }
        }
    }
    return mapping;
}

/* The current offset in milliseconds (0 without a file). */
static long long offset_ms(void)
{
    const char *v = offset_view();
    char buf[OFFSET_FILE_BYTES + 1];
    int i;
    if (!v)
        return 0;
    for (i = 0; i < OFFSET_FILE_BYTES; i++)
        buf[i] = v[i];
    buf[OFFSET_FILE_BYTES] = '\0';
    return strtoll(buf, NULL, 10);
}

static void shift(struct timespec *ts, long long ms)
{
    long long ns = (long long) ts->tv_nsec + (ms % 1000) * 1000000LL;
    ts->tv_sec += ms / 1000;
    if (ns < 0) {
        ns += 1000000000LL;
        ts->tv_sec -= 1;
    } else if (ns >= 1000000000LL) {
        ns -= 1000000000LL;
        ts->tv_sec += 1;
    }
    ts->tv_nsec = ns;
}

int clock_gettime(clockid_t clock, struct timespec *ts)
{
    static clock_gettime_fn real;
    int rc;
    if (!real)
        real = (clock_gettime_fn) dlsym(RTLD_NEXT, "clock_gettime");
    rc = real(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        shift(ts, offset_ms());
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz)
{
    static gettimeofday_fn real;
    int rc;
    if (!real)
        real = (gettimeofday_fn) dlsym(RTLD_NEXT, "gettimeofday");
    rc = real(tv, tz);
    if (rc == 0) {
        struct timespec ts = {tv->tv_sec, (long) tv->tv_usec * 1000L};
        shift(&ts, offset_ms());
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
