/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bearer-token rule both HTTP servers use (util/teu-bearer.h): which
 * token files are taken, which Authorization headers pass, and what is said when they do not.
 */
#include <glib.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "teu-bearer.h"

static int failures;

#define CHECK(cond)                                                                  \
	do {                                                                         \
		if (!(cond)) {                                                       \
			fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond); \
			failures++;                                                  \
		}                                                                    \
	} while (0)

static char *dir;

/* Writes `len` bytes to a file of the temporary folder; its path. */
static char *file_of(const char *name, const char *data, size_t len)
{
	char *path = g_build_filename(dir, name, NULL);
	GError *err = NULL;
	if (!g_file_set_contents(path, data, (gssize)len, &err)) {
		fprintf(stderr, "cannot write %s: %s\n", path, err->message);
		exit(1);
	}
	return path;
}

static bool refused_as(const teu_bearer *b, const char *header, const char *why)
{
	const char *got = teu_bearer_refuse(b, header);
	if (why == NULL)
		return got == NULL;
	return got != NULL && strcmp(got, why) == 0;
}

static void test_good_token(void)
{
	const char *tok = "Ab0-._~+/=cdefghijklmnop";
	char *text = g_strdup_printf("  %s \r\nsecond line is not the token\n", tok);
	char *path = file_of("good", text, strlen(text));
	teu_bearer b = { 0 };
	bool weak = true;
	char why[512] = "";

	CHECK(teu_bearer_load(&b, path, &weak, why, sizeof why) == 0);
	CHECK(b.on && !weak);
	char *hdr = g_strdup_printf("Bearer %s", tok);
	CHECK(refused_as(&b, hdr, NULL));
	g_free(hdr);
	hdr = g_strdup_printf("bEARER   %s", tok); /* the scheme in any case, spaces after it */
	CHECK(refused_as(&b, hdr, NULL));
	g_free(hdr);
	CHECK(refused_as(&b, NULL, "no Authorization header"));
	CHECK(refused_as(&b, "Basic dXNlcjpwdw==", "not a Bearer token"));
	CHECK(refused_as(&b, "Bearer", "not a Bearer token"));
	hdr = g_strdup_printf("Bearer %sX", tok);
	CHECK(refused_as(&b, hdr, "wrong token"));
	g_free(hdr);
	hdr = g_strdup_printf("Bearer %.*s", (int)strlen(tok) - 1, tok);
	CHECK(refused_as(&b, hdr, "wrong token"));
	g_free(hdr);
	CHECK(refused_as(&b, "Bearer second line is not the token", "wrong token"));
	/* Cleared: no token asked for any more. */
	teu_bearer_clear(&b);
	CHECK(!b.on);
	CHECK(refused_as(&b, NULL, NULL));
	g_free(text);
	g_free(path);
}

static void test_weak_and_longest(void)
{
	teu_bearer b = { 0 };
	bool weak = false;
	char why[512];
	char *path = file_of("short", "abc", 3);

	CHECK(teu_bearer_load(&b, path, &weak, why, sizeof why) == 0);
	CHECK(b.on && weak);
	CHECK(refused_as(&b, "Bearer abc", NULL));
	g_free(path);

	char *big = g_malloc(TEU_BEARER_MAX + 2);
	memset(big, 'z', TEU_BEARER_MAX + 1);
	big[TEU_BEARER_MAX + 1] = '\0';
	path = file_of("longest", big, TEU_BEARER_MAX);
	b = (teu_bearer){ 0 };
	CHECK(teu_bearer_load(&b, path, &weak, why, sizeof why) == 0);
	CHECK(b.on && !weak);
	char *hdr = g_strdup_printf("Bearer %.*s", TEU_BEARER_MAX, big);
	CHECK(refused_as(&b, hdr, NULL));
	g_free(hdr);
	g_free(path);

	path = file_of("too-long", big, TEU_BEARER_MAX + 1);
	b = (teu_bearer){ 0 };
	CHECK(teu_bearer_load(&b, path, &weak, why, sizeof why) == -EINVAL);
	CHECK(!b.on);
	CHECK(strstr(why, path) != NULL && strstr(why, "the first line must be a token") != NULL);
	CHECK(strstr(why, "zzzz") == NULL); /* never the token */
	g_free(path);
	g_free(big);
}

/* First lines that are no token; the file is named for its index. */
static const char *const not_tokens[] = {
	"",                                  /* empty */
	"\nlater-line-is-not-read\n",        /* a blank first line */
	"abcdefgh ijklmnopq\n",              /* a space inside */
	"abcdefghijklmnop\"\n",              /* a quote */
	"user:password-password\n",          /* a colon */
	"abcdefghijklmnop\xc3\xa9\n",        /* not ASCII */
};

static void test_refused_files(void)
{
	for (size_t i = 0; i < sizeof not_tokens / sizeof *not_tokens; i++) {
		char name[32];
		snprintf(name, sizeof name, "bad-%zu", i);
		char *path = file_of(name, not_tokens[i], strlen(not_tokens[i]));
		teu_bearer b = { 0 };
		bool weak = false;
		char why[512] = "";
		int rc = teu_bearer_load(&b, path, &weak, why, sizeof why);
		if (rc != -EINVAL || b.on || strstr(why, "the first line must be a token") == NULL) {
			fprintf(stderr, "file %s: rc %d, on %d, why '%s'\n", name, rc, b.on, why);
			failures++;
		}
		CHECK(refused_as(&b, "Bearer anything", NULL)); /* nothing asked for */
		g_free(path);
	}

	char *missing = g_build_filename(dir, "no-such-file", NULL);
	teu_bearer b = { 0 };
	bool weak = false;
	char why[512] = "";
	CHECK(teu_bearer_load(&b, missing, &weak, why, sizeof why) == -EIO);
	CHECK(!b.on);
	CHECK(strncmp(why, "cannot read the token file: ", 28) == 0);
	g_free(missing);

	/* A good token in a file others could have written: refused, saying
	 * whose file it is and its mode (docs/security.md). */
	const char *tok = "Ab0-._~+/=cdefghijklmnop\n";
	char *open_file = file_of("other-writable", tok, strlen(tok));
	CHECK(chmod(open_file, 0606) == 0);
	CHECK(teu_bearer_load(&b, open_file, &weak, why, sizeof why) == -EPERM);
	CHECK(!b.on);
	CHECK(strstr(why, "refused the token file") != NULL);
	CHECK(strstr(why, "mode 0606) can be written by others") != NULL);
	CHECK(strstr(why, "Ab0") == NULL);
	CHECK(chmod(open_file, 0600) == 0);
	CHECK(teu_bearer_load(&b, open_file, &weak, why, sizeof why) == 0);
	CHECK(b.on);
	g_free(open_file);
}

static void remove_dir(void)
{
	GDir *d = g_dir_open(dir, 0, NULL);
	const char *n;
	while (d != NULL && (n = g_dir_read_name(d)) != NULL) {
		char *p = g_build_filename(dir, n, NULL);
		g_unlink(p);
		g_free(p);
	}
	if (d != NULL)
		g_dir_close(d);
	g_rmdir(dir);
}

int main(void)
{
	GError *err = NULL;
	dir = g_dir_make_tmp("te-bearer-XXXXXX", &err);
	if (dir == NULL) {
		fprintf(stderr, "no temporary folder: %s\n", err->message);
		return 1;
	}
	test_good_token();
	test_weak_and_longest();
	test_refused_files();
	remove_dir();
	g_free(dir);
	if (failures > 0) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("bearer: all checks passed\n");
	return 0;
}
