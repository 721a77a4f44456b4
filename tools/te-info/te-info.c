/* SPDX-License-Identifier: Apache-2.0 */
/* te-info: what libte finds on this machine: plugin directories, plugins
 * (loaded or why not), transport reports, NUMA nodes, network interfaces. */
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>

#include <te/te.h>
#include <te/te-plugin.h> /* TE_PLUGIN_ABI_*: the plugin ABI this libte hosts; te_plugin_kind_name() */

static void print_dir(const char *dir, int exists, void *user)
{
	(void)user;
	printf("  %s%s\n", dir, exists ? "" : "  (missing)");
}

static void print_plugin(const te_plugin_info *p, void *user)
{
	int *transports = user;

	if (p->loaded) {
		printf("  %-10s %-9s %-8s plugin ABI %u.%u  %s\n", p->name, te_plugin_kind_name(p->kind),
		       p->version ? p->version : "?", p->abi_major, p->abi_minor, p->path);
		if (p->description)
			printf("             %s\n", p->description);
		if (p->kind == TE_KIND_TRANSPORT)
			transports[0]++;
	} else {
		printf("  skipped    %s\n             %s\n", p->path, p->reason ? p->reason : "?");
	}
}

static void report_transport(const te_plugin_info *p, void *user)
{
	char *text = NULL;
	(void)user;

	/* Transports report what they find; device plugins their devices, or
	 * why they are idle (no driver, no device). */
	if (!p->loaded || (p->kind != TE_KIND_TRANSPORT && p->kind != TE_KIND_DEVICE))
		return;
	printf("\n[%s]%s\n", p->name, p->kind == TE_KIND_DEVICE ? " (device memory)" : "");
	if (te_plugin_report(p->name, &text) == 0 && text != NULL) {
		fputs(text, stdout);
		if (*text && text[strlen(text) - 1] != '\n')
			putchar('\n');
	} else {
		printf("  (no report)\n");
	}
	te_free(text);
}

static void print_numa(void)
{
	DIR *d = opendir("/sys/devices/system/node");
	struct dirent *ent;
	int n = 0;

	printf("\nNUMA nodes:\n");
	if (d != NULL) {
		while ((ent = readdir(d)) != NULL) {
			char path[512], cpus[256] = "";
			if (strncmp(ent->d_name, "node", 4) != 0 || ent->d_name[4] < '0' || ent->d_name[4] > '9')
				continue;
			snprintf(path, sizeof path, "/sys/devices/system/node/%s/cpulist", ent->d_name);
			FILE *f = fopen(path, "r");
			if (f != NULL) {
				if (fgets(cpus, sizeof cpus, f) == NULL)
					cpus[0] = '\0';
				fclose(f);
			}
			cpus[strcspn(cpus, "\n")] = '\0';
			printf("  %s  cpus %s\n", ent->d_name, cpus);
			n++;
		}
		closedir(d);
	}
	if (n == 0)
		printf("  none reported (single node)\n");
}

static void print_ifaces(void)
{
	struct ifaddrs *ifa = NULL;

	printf("\nNetwork interfaces:\n");
	if (getifaddrs(&ifa) != 0) {
		printf("  cannot list: getifaddrs failed\n");
		return;
	}
	for (struct ifaddrs *i = ifa; i != NULL; i = i->ifa_next) {
		char host[NI_MAXHOST];
		if (i->ifa_addr == NULL ||
		    (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
			continue;
		if (getnameinfo(i->ifa_addr,
				i->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
								  : sizeof(struct sockaddr_in6),
				host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0)
			continue;
		printf("  %-12s %-40s %s\n", i->ifa_name, host, (i->ifa_flags & IFF_UP) ? "up" : "down");
	}
	freeifaddrs(ifa);
}

int main(int argc, char **argv)
{
	int transports = 0;

	if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		printf("usage: te-info\n"
		       "Lists libte's plugin directories, the plugins found in them (loaded, or why\n"
		       "they were skipped), each transport's view of this machine (e.g. RDMA devices\n"
		       "and NIC priority matrix), device plugins and their devices (or why they\n"
		       "are idle), NUMA nodes and network interfaces.\n"
		       "Environment: TE_PLUGIN_PATH (extra plugin directories, searched first),\n"
		       "TE_PLUGINS (allow/deny list, e.g. tcp,^rdma), TE_LOG_LEVEL.\n");
		return 0;
	}
	if (argc > 1) {
		fprintf(stderr, "te-info: unknown argument '%s' (try --help)\n", argv[1]);
		return 2;
	}
	/* Three versions (docs/abi.md): the library's, whose major.minor is the
	 * API version of te.h and whose major is the soname's; and the plugin ABI,
	 * counted on its own. The API version is the running library's, not the
	 * header's this program was built with. */
	unsigned api_major = 0, api_minor = 0;
	if (sscanf(te_version(), "%u.%u", &api_major, &api_minor) != 2)
		api_major = TE_ABI_MAJOR, api_minor = TE_ABI_MINOR;
	printf("libte %s (API %u.%u, soname libte.so.%u, plugin ABI %d.%d)\n\n"
	       "Plugin directories searched, in order:\n",
	       te_version(), api_major, api_minor, api_major, TE_PLUGIN_ABI_MAJOR,
	       TE_PLUGIN_ABI_MINOR);
	te_plugin_dirs(print_dir, NULL);
	printf("\nPlugins:\n");
	int usable = te_plugin_foreach(print_plugin, &transports);
	if (usable == 0)
		printf("  none usable\n");
	te_plugin_foreach(report_transport, NULL);
	print_numa();
	print_ifaces();
	return 0;
}
