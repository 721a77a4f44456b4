/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The transport's open of a checked path (its sources are built into this
 * test), for what an engine-level test cannot time: the path changing between
 * the check and the open. A symlink where the checked path had none, in its
 * last component or in a directory on the way, and another file in its place
 * are all refused rather than opened. Run once with openat2() and once with
 * the fallback for kernels without it (the test's own syscall() then answers
 * openat2 with ENOSYS).
 */
#include <dlfcn.h>
#include <sys/syscall.h>

#include "../../plugins/transport/nvmeof/nvmeof.h"
#include "nv-util.h"

static bool no_openat2;

/* Stands in for libc's syscall() within this test so that the plugin code
 * built into it sees a kernel without openat2 when asked to. */
long syscall(long nr, ...)
{
	static long (*real)(long, ...);
	va_list ap;
	long a[6];

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
#ifdef SYS_openat2
	if (nr == SYS_openat2 && no_openat2) {
		errno = ENOSYS;
		return -1;
	}
#endif
	if (real == NULL)
		real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	return real(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

static struct stat stat_of(const char *path)
{
	struct stat st;
	REQUIRE(lstat(path, &st) == 0);
	return st;
}

static void expect_open(const char *path, const struct stat *want, bool ok)
{
	int fd = nv_open_resolved(path, O_RDONLY | O_NONBLOCK, want);
	if ((fd >= 0) != ok)
		fprintf(stderr, "  %s: %s, wanted %s\n", path, fd >= 0 ? "opened" : nv_strerror(fd),
			ok ? "open" : "refused");
	CHECK((fd >= 0) == ok);
	if (fd >= 0)
		close(fd);
}

static void test_swaps(void)
{
	unsigned char b[16] = { 1 };
	nv_write_file(nv_path("real/f"), b, sizeof b);
	nv_write_file(nv_path("other"), b, sizeof b);
	struct stat f = stat_of(nv_path("real/f")), other = stat_of(nv_path("other"));

	expect_open(nv_path("real/f"), &f, true);
	/* the last component became a symlink to the checked file */
	expect_open(nv_path("link"), &f, false);
	/* a directory on the way became a symlink */
	expect_open(nv_path("dlink/f"), &f, false);
	/* another file (or a FIFO) now sits at the checked path */
	expect_open(nv_path("real/f"), &other, false);
	expect_open(nv_path("fifo"), &f, false);
	/* the O_DIRECT reopen of a file that changed meanwhile */
	CHECK_EQ(nv_open_resolved(nv_path("real/f"), O_RDONLY, &other), -ESTALE);
}

int main(void)
{
	nv_setup();
	REQUIRE(mkdir(nv_path("real"), 0755) == 0);
	REQUIRE(symlink(nv_path("real/f"), nv_path("link")) == 0);
	REQUIRE(symlink(nv_path("real"), nv_path("dlink")) == 0);
	REQUIRE(mkfifo(nv_path("fifo"), 0644) == 0);

	TEST_RUN(test_swaps);
	no_openat2 = true;
	fprintf(stderr, "without openat2:\n");
	TEST_RUN(test_swaps);
	return check_done();
}
