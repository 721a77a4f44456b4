/* SPDX-License-Identifier: Apache-2.0 */
#include <stdio.h>

#include "teu-pci.h"

/* -1 when unknown. */
int teu_pci_numa_node(const char *bus_id)
{
	char path[128], lower[32];
	size_t i;
	int node = -1;

	for (i = 0; bus_id[i] != '\0' && i + 1 < sizeof lower; i++)
		lower[i] = (char)(bus_id[i] >= 'A' && bus_id[i] <= 'F' ? bus_id[i] + 32 : bus_id[i]);
	lower[i] = '\0';
	snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/numa_node", lower);
	FILE *f = fopen(path, "r");
	if (f != NULL) {
		if (fscanf(f, "%d", &node) != 1)
			node = -1;
		fclose(f);
	}
	return node;
}

void teu_pci_info(te_device_info *d, bool found)
{
	if (found) {
		d->pci_bus_id[sizeof d->pci_bus_id - 1] = '\0';
		d->numa_node = teu_pci_numa_node(d->pci_bus_id);
	} else {
		d->pci_bus_id[0] = '\0';
	}
}
