/* Atomic file replacement: temp file in the destination's directory, fsync, rename, fsync dir. */
#include "models/atomic_file.h"

#include "core/internal.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static atomic_uint tmp_counter;

static void free_names(dg_atomic_file *af) {
    free(af->path);
    free(af->tmp);
    af->path = af->tmp = NULL;
}

int dg_atomic_open(dg_atomic_file *af, const char *path, const char *what) {
    memset(af, 0, sizeof *af);
    if (!path || !*path) {
        dg_error("%s: empty output path", what);
        return -1;
    }
    /* ".NAME.tmp-PID-N" in the same directory as NAME, so that rename never crosses filesystems */
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
    const char *base = path + dir_len;
    if (!*base) {
        dg_error("%s: output path '%s' names a directory, not a file", what, path);
        return -1;
    }
    size_t n = strlen(path) + 64;
    af->path = strdup(path);
    af->tmp = malloc(n);
    if (!af->path || !af->tmp) {
        free_names(af);
        dg_error("%s: out of memory", what);
        return -1;
    }
    unsigned k = atomic_fetch_add(&tmp_counter, 1);
    snprintf(af->tmp, n, "%.*s.%s.tmp-%ld-%u", (int)dir_len, path, base, (long)getpid(), k);
    int fd = open(af->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        dg_error("%s: cannot create '%s': %s", what, af->tmp, strerror(errno));
        free_names(af);
        return -1;
    }
    af->f = fdopen(fd, "wb");
    if (!af->f) {
        dg_error("%s: fdopen '%s': %s", what, af->tmp, strerror(errno));
        close(fd);
        unlink(af->tmp);
        free_names(af);
        return -1;
    }
    return 0;
}

/* ".NAME.tmp-PID-N": the PID, or -1 for any other name */
static long stale_pid(const char *name) {
    const char *t = name[0] == '.' ? strstr(name, ".tmp-") : NULL;
    if (!t || t == name) return -1;
    char *end;
    long pid = strtol(t + 5, &end, 10);
    if (pid <= 0 || *end != '-' || !end[1]) return -1;
    for (const char *p = end + 1; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    return pid;
}

int dg_atomic_remove_stale(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        dg_error("cannot read the directory '%s': %s", dir, strerror(errno));
        return -1;
    }
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long pid = stale_pid(e->d_name);
        if (pid < 0) continue;
        bool gone = pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
        if (!gone) continue;
        size_t n = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(n);
        if (!path) continue;
        snprintf(path, n, "%s/%s", dir, e->d_name);
        removed += unlink(path) == 0;
        free(path);
    }
    closedir(d);
    return removed;
}

void dg_atomic_abort(dg_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp) unlink(af->tmp);
    free_names(af);
}

int dg_fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!dir) return -1;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int dg_atomic_commit(dg_atomic_file *af, const char *what) {
    if (!af->f) {
        dg_error("%s: commit of a file that is not open", what);
        return -1;
    }
    int err = 0;
    const char *step = "";
    if (ferror(af->f)) err = EIO, step = "write";
    else if (fflush(af->f) != 0) err = errno, step = "fflush";
    else if (fsync(fileno(af->f)) != 0) err = errno, step = "fsync";
    if (fclose(af->f) != 0 && !err) err = errno, step = "fclose";
    af->f = NULL;
    if (!err && rename(af->tmp, af->path) != 0) err = errno, step = "rename";
    if (err) {
        dg_error("%s: writing '%s' failed (%s: %s)", what, af->path, step, strerror(err));
        dg_atomic_abort(af);
        return -1;
    }
    /* the rename is done; a failed directory fsync only weakens durability, not atomicity */
    if (dg_fsync_parent_dir(af->path) != 0) {
        dg_error("%s: fsync of the directory of '%s' failed: %s", what, af->path, strerror(errno));
        free_names(af);
        return -1;
    }
    free_names(af);
    return 0;
}
