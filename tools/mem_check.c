/* Host memory check of the tools (see mem_check.h). */
#include "tools/mem_check.h"

#include <stdio.h>
#include <string.h>

double dg_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kib = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "MemAvailable:", 13) == 0 && sscanf(line + 13, "%lf", &kib) == 1) break;
    fclose(f);
    return kib * 1024.0;
}

int dg_check_host_memory(const char *cmd, const char *what, double need) {
    const double avail = dg_host_mem_available();
    if (avail <= 0 || need <= avail) return 0;
    fprintf(stderr,
            "%s: %s needs about %.1f GiB of host memory; %.1f GiB is available (MemAvailable). Use smaller sizes.\n",
            cmd, what, need / 1073741824.0, avail / 1073741824.0);
    return -1;
}

void dg_note_device_memory_unchecked(const char *cmd) {
    fprintf(stderr,
            "%s: note: device memory is not checked before the run (the library does not report the "
            "device's free memory)\n",
            cmd);
}
