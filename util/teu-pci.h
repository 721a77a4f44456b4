/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared by the device plugins: the NUMA node of a PCI device from sysfs,
 * for te_device_info.numa_node (the topology places a GPU by it when its
 * PCI bus id is not behind a known switch). Drivers report bus ids in
 * upper case ("0000:3B:00.0"); sysfs names them in lower case.
 */
#ifndef TEU_PCI_H
#define TEU_PCI_H

#include <stdbool.h>

#include <te/te-plugin.h>

/* -1 when unknown. */
int teu_pci_numa_node(const char *bus_id);

/* The PCI side of a device's entry once its driver was asked for the bus
 * id: `found` (the driver wrote it to d->pci_bus_id), the id NUL-terminated
 * and its NUMA node; else no bus id, and the node left as it was. */
void teu_pci_info(te_device_info *d, bool found);

#endif
