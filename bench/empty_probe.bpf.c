// SPDX-License-Identifier: GPL-2.0
/* The floor of a uprobe's cost: a program that does nothing. bench/uprobe_cost.sh compares
 * gpuscope's probes against it on the same function. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>

SEC("uprobe")
int empty(void *ctx)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
