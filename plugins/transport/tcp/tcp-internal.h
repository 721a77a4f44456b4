/* SPDX-License-Identifier: Apache-2.0 */
/* The plugin's entry (tcp-plugin.c) reaches everything through here. */
#include "tcp-conn.h"
