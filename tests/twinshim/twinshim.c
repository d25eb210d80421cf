/*
 * tests/twinshim: makes a PostgreSQL server, started from a copy of another's data
 * directory, a copy of that server *with its memory* as far as the registry can tell (issue
 * 37: a VM cloned or reverted with its memory, a restored process snapshot). No such copy can
 * be made on the test machine, so the test gives the copy what one would have: the same
 * postmaster token (drawn with getrandom at preload, in the postmaster) and, from the copied
 * data directory, the same claim tokens and generator state.
 *
 * Loaded with LD_PRELOAD into every process of a server. In the process that the library was
 * first loaded into by exec (the postmaster: pg_ctl's shell execs it), every getrandom() of
 * 16 bytes returns the 16 bytes given in hex by SNOWFLAKE_TWIN_RANDOM. Every other process
 * (the registry worker, backends: forked, so the constructor does not run again) gets the
 * kernel's bytes: the tokens the worker draws for its requests differ between the copies,
 * as on a real copy.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static pid_t postmaster;
static unsigned char twin[16];
static int have_twin;

__attribute__((constructor)) static void twinshim_init(void)
{
	const char *hex = getenv("SNOWFLAKE_TWIN_RANDOM");

	postmaster = getpid();
	if (hex == NULL || strlen(hex) != 2 * sizeof twin)
		return;
	for (size_t i = 0; i < sizeof twin; i++)
	{
		unsigned int v;

		if (sscanf(hex + 2 * i, "%2x", &v) != 1)
			return;
		twin[i] = (unsigned char) v;
	}
	have_twin = 1;
}

ssize_t getrandom(void *buf, size_t len, unsigned int flags)
{
	static ssize_t (*real_getrandom)(void *, size_t, unsigned int);

	if (have_twin && len == sizeof twin && getpid() == postmaster)
	{
		memcpy(buf, twin, len);
		return (ssize_t) len;
	}
	if (real_getrandom == NULL)
		real_getrandom = (ssize_t (*)(void *, size_t, unsigned int)) dlsym(RTLD_NEXT, "getrandom");
	return real_getrandom(buf, len, flags);
}
