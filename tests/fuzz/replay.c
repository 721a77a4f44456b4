/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Replays a harness's inputs without libFuzzer: every file of the folders
 * named on the command line (or each file named) goes once through
 * LLVMFuzzerTestOneInput. The
 * plain and sanitizer builds run the seed corpus and the regressions (inputs
 * that once crashed) this way, so a fixed bug stays fixed without clang.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		return -1;
	}
	size_t cap = 4096, n = 0;
	uint8_t *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
		n += r;
		if (n == cap)
			buf = realloc(buf, cap *= 2);
	}
	fclose(f);
	if (buf == NULL)
		return -1;
	/* An exact-size copy: ASan sees any read past the input's end. */
	uint8_t *exact = malloc(n ? n : 1);
	memcpy(exact, buf, n);
	free(buf);
	LLVMFuzzerTestOneInput(exact, n);
	free(exact);
	return 0;
}

/* Runs every regular file of `dir` (names starting with '.' aside), in name
 * order; the count, or -1 when the folder cannot be read. */
static int replay_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		return -1;
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		names = realloc(names, (n + 1) * sizeof *names);
		names[n++] = strdup(de->d_name);
	}
	closedir(d);
	if (n > 1)
		qsort(names, n, sizeof *names, cmp);
	int count = 0;
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		struct stat st;
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
			if (replay_file(path) < 0)
				count = -1;
			else if (count >= 0)
				count++;
		}
		free(names[i]);
	}
	free(names);
	return count;
}

int main(int argc, char **argv)
{
	int total = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR [REGRESSIONS_DIR...] | FILE...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat st;
		/* A file on its own: one input (a crash being looked at). */
		if (stat(argv[i], &st) == 0 && S_ISREG(st.st_mode)) {
			if (replay_file(argv[i]) < 0)
				return 1;
			total++;
			continue;
		}
		int n = replay_dir(argv[i]);
		if (n < 0)
			return 1;
		printf("%s: %d inputs\n", argv[i], n);
		/* The seed corpus (first folder) must not be empty: a harness
		 * that runs nothing would pass for nothing. */
		if (i == 1 && n == 0) {
			fprintf(stderr, "%s holds no inputs\n", argv[i]);
			return 1;
		}
		total += n;
	}
	printf("%d inputs replayed\n", total);
	return 0;
}
