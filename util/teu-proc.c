/* SPDX-License-Identifier: Apache-2.0 */
#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

#include "teu-proc.h"

/* Whether socket inode `ino` is an established connection in a
 * /proc/PID/net/tcp{,6} table (the process's network namespace). */
bool teu_proc_established(pid_t pid, unsigned long ino)
{
	static const char *const tables[] = { "tcp", "tcp6" };
	char path[64], line[512];

	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "/proc/%d/net/%s", (int)pid, tables[i]);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			continue;
		bool found = false;
		while (!found && fgets(line, sizeof line, f) != NULL) {
			unsigned st;
			unsigned long in;
			/* sl local rem st tx:rx tr:when retrnsmt uid timeout inode */
			if (sscanf(line, " %*s %*s %*s %x %*s %*s %*s %*s %*s %lu", &st, &in) == 2 && in == ino)
				found = st == 1; /* TCP_ESTABLISHED */
		}
		fclose(f);
		if (found)
			return true;
	}
	return false;
}

/* Its open descriptors and, among them, established TCP connections. */
void teu_proc_fds(pid_t pid, int *fds, int *tcp)
{
	char path[64];
	struct dirent *de;

	*fds = *tcp = 0;
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(path);
	while (d != NULL && (de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		(*fds)++;
		char link[300], to[64];
		snprintf(link, sizeof link, "/proc/%d/fd/%s", (int)pid, de->d_name);
		ssize_t n = readlink(link, to, sizeof to - 1);
		unsigned long ino;
		if (n > 0) {
			to[n] = '\0';
			if (sscanf(to, "socket:[%lu]", &ino) == 1 && teu_proc_established(pid, ino))
				(*tcp)++;
		}
	}
	if (d != NULL)
		closedir(d);
}

/* Its resident set (VmRSS), KiB; 0 when unknown. */
long teu_proc_rss_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = 0;

	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	while (f != NULL && fgets(line, sizeof line, f) != NULL)
		if (sscanf(line, "VmRSS: %ld", &kb) == 1)
			break;
	if (f != NULL)
		fclose(f);
	return kb;
}
