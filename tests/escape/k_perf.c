/* perf events: kernel profiling, side channels, a long CVE history. */
#include "attack.h"
#include <linux/perf_event.h>

int main(void) {
    struct perf_event_attr attr = {.type = PERF_TYPE_SOFTWARE, .size = sizeof attr,
                                   .config = PERF_COUNT_SW_CPU_CLOCK};
    MUST_FAIL("perf_event_open(self)", EPERM, syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
    MUST_FAIL("perf_event_open(all cpus)", EPERM, syscall(SYS_perf_event_open, &attr, -1, 0, -1, 0));
    return finish();
}
