/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Shared by the device plugins: the NUMA node of a PCI device from sysfs,
 * for te_device_info.numa_node (the topology places a GPU by it when its
 * PCI bus id is not behind a known switch). Drivers report bus ids in
 * upper case ("0000:3B:00.0"); sysfs names them in lower case.
 */
#ifndef TEU_PCI_H
#define TEU_PCI_H

/* -1 when unknown. */
int teu_pci_numa_node(const char *bus_id);

#endif
