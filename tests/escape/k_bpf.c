/* eBPF maps and programs (unprivileged BPF is how many kernel exploits start). */
#include "attack.h"
#include <linux/bpf.h>

int main(void) {
    union bpf_attr map = {.map_type = BPF_MAP_TYPE_ARRAY, .key_size = 4, .value_size = 8, .max_entries = 1};
    MUST_FAIL("BPF_MAP_CREATE", EPERM, syscall(SYS_bpf, BPF_MAP_CREATE, &map, sizeof map));
    struct bpf_insn prog[] = {{.code = BPF_JMP | BPF_EXIT}};
    union bpf_attr load = {.prog_type = BPF_PROG_TYPE_SOCKET_FILTER, .insn_cnt = 1,
                           .insns = (unsigned long)prog, .license = (unsigned long)"GPL"};
    MUST_FAIL("BPF_PROG_LOAD", EPERM, syscall(SYS_bpf, BPF_PROG_LOAD, &load, sizeof load));
    return finish();
}
