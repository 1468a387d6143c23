/* One training process a GPU, started and watched by `deltagrad train --gpus N` (launch_gpus.h).
 *
 * Each rank is this program again (/proc/self/exe, the same arguments) with DG_WORLD, DG_RANK,
 * DG_CUDA_DEVICE and DG_RENDEZVOUS in its environment (models/data_parallel.h), in its own process
 * group so that a Ctrl-C reaches this process alone, which passes it on once to every rank (a second
 * one passed on kills them, as a second Ctrl-C kills a single run).  A rank dies with this process
 * (PR_SET_PDEATHSIG), so none is left waiting on a communicator whose launcher is gone.
 *
 * Watching: the ranks are polled (waitpid, WNOHANG) so that signals and deaths are seen within a
 * fraction of a second.  A rank that fails (a non-zero status other than the one a passed-on signal
 * asks for, or killed by a signal) is reported by rank, GPU and cause; the others, which would wait
 * for it in their next all-reduce, get SIGTERM, and SIGKILL DG_LAUNCH_GRACE_S seconds later.  The
 * checkpoint on disk is the last one rank 0 completed: checkpoints are written atomically. */
#include "tools/launch_gpus.h"

#include "core/device.h"
#include "deltagrad.h"
#include "models/metrics.h"
#include "ops/collective.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t launcher_signal;  /* the last SIGINT or SIGTERM this process got */
static volatile sig_atomic_t launcher_signals; /* how many */

static void on_launcher_signal(int sig) {
    launcher_signal = sig;
    launcher_signals++;
}

static int visible_gpus(void) {
#ifdef DG_HAVE_CUDA
    return dg_cuda_device_count();
#else
    return 0;
#endif
}

/* The number of GPUs o asks for, checked against this machine: > 0, or -1 (message printed). */
static int gpus_wanted(const dg_train_opts *o) {
    if (o->gpus == 1) return 1;
    int visible = visible_gpus();
    int n = o->gpus > 0 ? o->gpus : visible;
    if (o->gpus == 0 && visible <= 1) return 1;
    if (o->tc.device != DG_CUDA) {
        fprintf(stderr, "train: --gpus %d trains on GPUs; --device %s cannot (--device cuda)\n", o->gpus,
                dg_device_name(o->tc.device));
        return -1;
    }
    if (!dg_comm_available()) {
        unsigned char id[DG_COMM_ID_BYTES];
        dg_comm_unique_id(id); /* fails, saying why */
        fprintf(stderr, "train: --gpus %d: %s\n", o->gpus, dg_last_error());
        return -1;
    }
    if (visible < n) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        fprintf(stderr, "train: --gpus %d: %d CUDA device%s visible%s%s%s\n", n, visible,
                visible == 1 ? " is" : "s are", cvd ? " (CUDA_VISIBLE_DEVICES=" : "", cvd ? cvd : "", cvd ? ")" : "");
        return -1;
    }
    if (o->tc.batch % n != 0) {
        fprintf(stderr,
                "train: --batch %lld does not split into %d equal slices: the global batch must be a multiple of "
                "the number of GPUs\n",
                (long long)o->tc.batch, n);
        return -1;
    }
    return n;
}

/* Starts rank r: a child process that execs this program with args (NULL-terminated).  The
 * environment and the arguments are made here, before fork: between fork and exec the child only
 * makes system calls, as a child of a process with threads (OpenMP's, OpenBLAS's) must.  The pid,
 * or -1. */
static pid_t start_rank(char **args, int r, int n, const char *rendezvous, pid_t parent) {
    char s[32];
    snprintf(s, sizeof s, "%d", r);
    setenv("DG_RANK", s, 1);
    setenv("DG_CUDA_DEVICE", s, 1);
    snprintf(s, sizeof s, "%d", n);
    setenv("DG_WORLD", s, 1);
    setenv("DG_RENDEZVOUS", rendezvous, 1);
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* NVLink multicast needs a fabric manager set up for it */
    unsetenv("DG_NCCL_ID");             /* the ranks meet through the file */
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0) return pid; /* the parent (or -1) */
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1); /* the launcher died before prctl: do not run alone */
    execv("/proc/self/exe", args);
    static const char msg[] = "train: a rank could not start: execv(/proc/self/exe) failed\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(127);
}

static void signal_all(const pid_t *pids, const bool *done, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (pids[r] > 0 && !done[r]) kill(pids[r], sig);
}

/* Waits for the n ranks; the run's exit status. */
static int watch(pid_t *pids, int n, const char *out_dir) {
    bool *done = calloc((size_t)n, sizeof *done);
    if (!done) {
        fprintf(stderr, "train: out of memory; stopping the ranks\n");
        for (int r = 0; r < n; r++) kill(pids[r], SIGKILL);
        for (int r = 0; r < n; r++) waitpid(pids[r], NULL, 0);
        return 1;
    }
    int left = n, status = 0, passed_on = 0, forwarded = 0;
    bool failed = false;
    double kill_at = -1; /* > 0: SIGKILL the ranks left at this time */
    while (left > 0) {
        if (launcher_signals > forwarded) { /* pass each new signal on, once */
            forwarded = launcher_signals;
            passed_on = launcher_signal;
            signal_all(pids, done, n, passed_on);
        }
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid < 0 && errno != EINTR) break; /* no child left (should not happen while left > 0) */
        if (pid <= 0) {
            if (kill_at > 0 && dg_progress_now() > kill_at) {
                signal_all(pids, done, n, SIGKILL);
                kill_at = -1;
            }
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        int r = 0;
        while (r < n && pids[r] != pid) r++;
        if (r == n) continue;
        done[r] = true;
        left--;
        /* a rank stopped by the signal passed on (with its checkpoint, or killed by it before it
         * installed its handler, while starting) is not a failure */
        bool by_signal = passed_on && ((WIFEXITED(st) && WEXITSTATUS(st) == 128 + passed_on) ||
                                       (WIFSIGNALED(st) && WTERMSIG(st) == passed_on));
        if ((WIFEXITED(st) && WEXITSTATUS(st) == 0) || by_signal) {
            if (by_signal && !failed) status = 128 + passed_on;
            continue;
        }
        if (!failed) { /* the first failure: report it, stop the others */
            if (WIFSIGNALED(st))
                fprintf(stderr, "train: rank %d (GPU %d, pid %d) was killed by signal %d (%s)", r, r, (int)pid,
                        WTERMSIG(st), strsignal(WTERMSIG(st)));
            else
                fprintf(stderr, "train: rank %d (GPU %d, pid %d) exited with status %d", r, r, (int)pid,
                        WEXITSTATUS(st));
            fprintf(stderr, "%s; the last checkpoint written, if any, is in %s\n",
                    left > 0 ? "; stopping the other ranks" : "", out_dir);
            signal_all(pids, done, n, SIGTERM);
            kill_at = dg_progress_now() + DG_LAUNCH_GRACE_S;
        }
        failed = true;
        status = 1;
    }
    free(done);
    return status;
}

bool dg_launch_gpus(int argc, char **argv, const dg_train_opts *o, int *status) {
    int n = gpus_wanted(o);
    if (n == 1) return false;
    *status = 2;
    if (n < 0) return true;
    /* the rendezvous file lives in a directory of its own on this machine (every rank runs here);
     * runs across machines name a file on a shared filesystem themselves (docs/MULTI_GPU.md) */
    const char *tmp = getenv("TMPDIR");
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/deltagrad-rendezvous-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "train: cannot create a rendezvous directory %s: %s\n", dir, strerror(errno));
        *status = 1;
        return true;
    }
    snprintf(path, sizeof path, "%s/nccl-id", dir);
    if (!o->quiet)
        fprintf(stderr, "deltagrad train: %d processes, one a GPU (0-%d); global batch %lld, %lld a GPU\n", n, n - 1,
                (long long)o->tc.batch, (long long)o->tc.batch / n);
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    char **args = calloc((size_t)argc + 2, sizeof *args); /* "deltagrad", "train", the options */
    int started = 0;
    if (pids && args) {
        args[0] = "deltagrad";
        for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
        for (; started < n; started++)
            if ((pids[started] = start_rank(args, started, n, path, getpid())) < 0) {
                fprintf(stderr, "train: cannot start rank %d: %s\n", started, strerror(errno));
                break;
            }
        const char *mine[] = {"DG_RANK", "DG_CUDA_DEVICE", "DG_WORLD", "DG_RENDEZVOUS"};
        for (int i = 0; i < 4; i++) unsetenv(mine[i]); /* this process is no rank */
    }
    if (!pids || !args) {
        fprintf(stderr, "train: out of memory\n");
        *status = 1;
    } else if (started < n) {
        for (int r = 0; r < started; r++) kill(pids[r], SIGKILL);
        for (int r = 0; r < started; r++) waitpid(pids[r], NULL, 0);
        *status = 1;
    } else {
        *status = watch(pids, n, o->tc.out_dir);
    }
    free(pids);
    free(args);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    unlink(path); /* rank 0 removes it once every rank joined; not when the run failed before */
    rmdir(dir);
    return true;
}
