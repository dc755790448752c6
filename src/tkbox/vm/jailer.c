/* tkbox-jailer: puts one VMM (a box's QEMU) in a cell of its own, then execs it.
 *
 * The daemon (tkbox.vm.jail) builds the command line; this program only does what
 * it says, in this order, and stops at the first step that fails, saying which on
 * stderr ("tkbox-jailer: <step>: <reason>", which reaches the VM's qemu.log):
 *
 *   in the jailer (it stays the VMM's parent and its supervisor):
 *     1. PR_SET_PDEATHSIG: it dies with the daemon;
 *     2. join the box's cgroup(s): write its pid to each --cgroup-fd (open
 *        cgroup.procs files), so the VMM is confined from its first instruction;
 *     3. --userns (an unprivileged daemon): a new user namespace that maps only the
 *        daemon's own uid and gid, setgroups denied;
 *     4. a new PID namespace (its next child is PID 1 there), then fork;
 *   in the child, PID 1 of that namespace, which becomes the VMM:
 *     5. new mount, IPC, UTS, network (loopback only, left down) and cgroup
 *        namespaces; every mount made private; hostname "tkbox-vmm";
 *     6. an empty tmpfs on --root; in it, each --bind (read-only, nosuid, nodev, its
 *        source's locked flags kept), each --dev (the host's character device,
 *        as it is, nosuid) and a proc of the new PID namespace
 *        (it shows only the VMM itself); then each --symlink; the tmpfs is made
 *        read-only;
 *     7. pivot_root into it and detach the old root: nothing else of the host's file
 *        system is reachable by any path;
 *     8. drop every capability from the bounding set; setgroups(none), setresgid,
 *        setresuid to --uid/--gid (root mode); clear ambient, inheritable, permitted
 *        and effective capabilities; PR_SET_NO_NEW_PRIVS; PR_SET_PDEATHSIG again
 *        (a credential change clears it), and quit if the jailer is already gone;
 *     9. close every descriptor but 0, 1, 2 and the --fd ones (the VMM's disks,
 *        sockets and memory files), and execve PROGRAM with an empty environment.
 *   the jailer closes its copies of the --fd descriptors, holds --hold-fd (the
 *   uid's lease), waits for the VMM and ends as it ended: the same exit status,
 *   or killed by the same signal (so the daemon sees the VMM's own end).
 *
 * Why a C program and not Python: the daemon is a threaded asyncio process, and the
 * steps between fork and exec (mounts, pivot_root, setuid, capset) are not safe to
 * run as Python in a forked child (a lock another thread held at fork stays held);
 * Python 3.11 has no os.unshare either. A fresh interpreter per box would cost tens
 * of milliseconds and about 10 MiB for each box's whole life, as the supervisor. This
 * is one file of plain system calls, each step in order and each failure named, that
 * starts in about a millisecond and holds well under a megabyte while it waits; it is
 * compiled with the host's C compiler the first time the daemon needs it (as
 * guest/spawn.c is), and `tkbox doctor` says so when there is no compiler.
 *
 * Its command line is the daemon's only; anything malformed is refused (exit 125).
 *
 *   tkbox-jailer --root DIR [--uid N --gid N | --userns] [--cgroup-fd N]...
 *                [--hold-fd N] [--fd N]... [--bind SRC DST]... [--dev NAME]...
 *                [--symlink DST TARGET]... [--no-exec] -- PROGRAM [ARG...]
 *
 * --no-exec sets the whole cell up and exits 0 in place of the exec: the daemon's
 * check, at start, that this host lets it build one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_ITEMS 1024
#define MAX_PATH 1024
#define MAX_CGROUPS 8
#define JAIL_FAILED 125

struct pair { const char *a, *b; };

static const char *root_dir;
static long uid = -1, gid = -1;
static int userns, no_exec, hold_fd = -1;
static int cgroup_fds[MAX_CGROUPS], n_cgroups;
static int keep_fds[MAX_ITEMS], n_keep;
static struct pair binds[MAX_ITEMS], links[MAX_ITEMS];
static int n_binds, n_links;
static const char *devs[16];
static int n_devs;
static char **program;

/* Failures before the fork: said on stderr. In the child, said through errfd too, so
 * the jailer reports it and ends with JAIL_FAILED rather than as a VMM that ran. */
static int errfd = -1;

static void say(const char *fmt, va_list ap, int err) {
    char msg[512];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0)
        return;
    if ((size_t)n >= sizeof msg)
        n = sizeof msg - 1;
    if (err)
        n += snprintf(msg + n, sizeof msg - (size_t)n, ": %s", strerror(err));
    if ((size_t)n >= sizeof msg)
        n = sizeof msg - 1;
    int fd = errfd >= 0 ? errfd : 2;
    ssize_t w = write(fd, msg, (size_t)n);
    (void)w;
}

__attribute__((noreturn, format(printf, 1, 2))) static void die(const char *fmt, ...) {
    int err = errno;
    va_list ap;
    if (errfd < 0) {
        ssize_t w = write(2, "tkbox-jailer: ", 14);
        (void)w;
    }
    va_start(ap, fmt);
    say(fmt, ap, err);
    va_end(ap);
    if (errfd < 0) {
        ssize_t w = write(2, "\n", 1);
        (void)w;
    }
    _exit(JAIL_FAILED);
}

__attribute__((noreturn, format(printf, 1, 2))) static void usage(const char *fmt, ...) {
    va_list ap;
    ssize_t w = write(2, "tkbox-jailer: usage: ", 21);
    (void)w;
    va_start(ap, fmt);
    say(fmt, ap, 0);
    va_end(ap);
    w = write(2, "\n", 1);
    _exit(JAIL_FAILED);
}

static long number(const char *s, long max) {
    char *end;
    errno = 0;
    if (!*s || *s == '-' || *s == '+')
        usage("not a number: %.40s", s);
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0 || v > max)
        usage("not a number from 0 to %ld: %.40s", max, s);
    return v;
}

/* A path in the cell: absolute, no empty, "." or ".." component, bounded. */
static const char *cell_path(const char *p) {
    size_t n = strlen(p);
    if (n < 2 || n >= MAX_PATH - 64 || p[0] != '/' || p[n - 1] == '/')
        usage("not an absolute path: %.80s", p);
    for (const char *c = p; *c; c++) {
        if (c[0] == '/' && (c[1] == '/' || (c[1] == '.' && (c[2] == '/' || !c[2] ||
                                                            (c[2] == '.' && (c[3] == '/' || !c[3]))))))
            usage("not a plain path: %.80s", p);
    }
    return p;
}

static void parse(int argc, char **argv) {
    int i = 1;
    for (; i < argc; i++) {
        const char *o = argv[i];
        int more = argc - i - 1;
        if (!strcmp(o, "--")) {
            i++;
            break;
        } else if (!strcmp(o, "--root") && more >= 1) {
            root_dir = cell_path(argv[++i]);
        } else if (!strcmp(o, "--uid") && more >= 1) {
            uid = number(argv[++i], 0x7fffffff);
        } else if (!strcmp(o, "--gid") && more >= 1) {
            gid = number(argv[++i], 0x7fffffff);
        } else if (!strcmp(o, "--userns")) {
            userns = 1;
        } else if (!strcmp(o, "--no-exec")) {
            no_exec = 1;
        } else if (!strcmp(o, "--cgroup-fd") && more >= 1) {
            if (n_cgroups == MAX_CGROUPS)
                usage("too many --cgroup-fd");
            cgroup_fds[n_cgroups++] = (int)number(argv[++i], 1 << 20);
        } else if (!strcmp(o, "--hold-fd") && more >= 1) {
            hold_fd = (int)number(argv[++i], 1 << 20);
        } else if (!strcmp(o, "--fd") && more >= 1) {
            if (n_keep == MAX_ITEMS)
                usage("too many --fd");
            keep_fds[n_keep++] = (int)number(argv[++i], 1 << 20);
        } else if (!strcmp(o, "--bind") && more >= 2) {
            if (n_binds == MAX_ITEMS)
                usage("too many --bind");
            binds[n_binds].a = cell_path(argv[++i]);
            binds[n_binds++].b = cell_path(argv[++i]);
        } else if (!strcmp(o, "--symlink") && more >= 2) {
            if (n_links == MAX_ITEMS)
                usage("too many --symlink");
            links[n_links].a = cell_path(argv[++i]);
            const char *t = argv[++i];
            if (!*t || strlen(t) >= MAX_PATH - 64)
                usage("bad symlink target");
            links[n_links++].b = t;
        } else if (!strcmp(o, "--dev") && more >= 1) {
            const char *d = argv[++i];
            static const char *const ok[] = {"null", "zero", "random", "urandom", "kvm", 0};
            int found = 0;
            for (int k = 0; ok[k]; k++)
                found |= !strcmp(d, ok[k]);
            if (!found || n_devs == 16)
                usage("--dev takes null, zero, random, urandom or kvm, once each");
            devs[n_devs++] = d;
        } else {
            usage("unknown or incomplete option %.40s", o);
        }
    }
    if (!root_dir)
        usage("--root is required");
    if (userns == (uid >= 0) || (uid >= 0) != (gid >= 0))
        usage("give --uid and --gid (root), or --userns (unprivileged)");
    if (userns && uid >= 0)
        usage("--userns runs as the daemon's own ids: no --uid");
    if (i >= argc)
        usage("no program after --");
    program = argv + i;
    if (program[0][0] != '/')
        usage("the program must be an absolute path in the cell");
}

static void write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        die("open %s", path);
    size_t n = strlen(text);
    if (write(fd, text, n) != (ssize_t)n)
        die("write %s", path);
    close(fd);
}

/* ROOT + path, bounded (paths were checked by cell_path). */
static void in_root(char *out, const char *path) {
    int n = snprintf(out, MAX_PATH, "%s%s", root_dir, path);
    if (n < 0 || n >= MAX_PATH)
        die("path too long in the cell: %.80s", path);
}

/* mkdir -p of path's parents inside the new root (a tmpfs only we write). */
static void parents(const char *path) {
    char buf[MAX_PATH];
    in_root(buf, path);
    size_t skip = strlen(root_dir);
    for (char *c = buf + skip + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = 0;
        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
            die("mkdir %s", buf + skip);
        struct stat st;
        if (lstat(buf, &st) < 0 || !S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            die("%s in the cell", buf + skip);
        }
        *c = '/';
    }
}

/* Flags a bind mount's remount must keep: in a user namespace the kernel refuses one
 * that would clear a flag the source's mount has locked. */
static unsigned long locked_flags(const char *src) {
    struct statvfs sv;
    if (statvfs(src, &sv) < 0)
        die("statvfs %s", src);
    unsigned long f = 0;
    if (sv.f_flag & ST_NOEXEC)
        f |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME)
        f |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME)
        f |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME)
        f |= MS_RELATIME;
    return f;
}

static void bind_ro(const char *src, const char *dst, int dev) {
    char target[MAX_PATH];
    struct stat st;
    if (stat(src, &st) < 0)
        die("stat %s", src);
    parents(dst);
    in_root(target, dst);
    if (S_ISDIR(st.st_mode)) {
        if (mkdir(target, 0755) < 0 && errno != EEXIST)
            die("mkdir %s in the cell", dst);
    } else {
        int fd = open(target, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0444);
        if (fd < 0)
            die("create %s in the cell", dst);
        close(fd);
    }
    if (mount(src, target, NULL, MS_BIND, NULL) < 0)
        die("bind %s", src);
    unsigned long flags = MS_REMOUNT | MS_BIND | MS_NOSUID | locked_flags(src);
    if (!dev)
        flags |= MS_NODEV | MS_RDONLY;
    if (mount(NULL, target, NULL, flags, NULL) < 0)
        die("make %s read-only", dst);
}

static void mount_proc(void) {
    char target[MAX_PATH];
    in_root(target, "/proc");
    if (mkdir(target, 0555) < 0 && errno != EEXIST)
        die("mkdir /proc in the cell");
    unsigned long f = MS_NOSUID | MS_NODEV | MS_NOEXEC;
    /* subset=pid: only the processes (here: the VMM alone), no /proc/sys, kcore, ... */
    if (mount("proc", target, "proc", f, "hidepid=invisible,subset=pid") < 0 &&
        mount("proc", target, "proc", f, "hidepid=2") < 0)
        die("mount proc");
}

static void make_cell(void) {
    if (unshare(CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | CLONE_NEWCGROUP) < 0)
        die("unshare mount, IPC, UTS, network and cgroup namespaces");
    if (sethostname("tkbox-vmm", 9) < 0)
        die("sethostname");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        die("make mounts private");
    if (mount("tmpfs", root_dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "mode=0755,size=64k,nr_inodes=4096") < 0)
        die("mount the cell's tmpfs on %s", root_dir);
    for (int i = 0; i < n_binds; i++)
        bind_ro(binds[i].a, binds[i].b, 0);
    for (int i = 0; i < n_devs; i++) {
        char src[64], dst[64];
        snprintf(src, sizeof src, "/dev/%s", devs[i]);
        struct stat st;
        if (stat(src, &st) < 0)
            die("stat %s", src);
        if (!S_ISCHR(st.st_mode)) {
            errno = ENODEV;
            die("%s is not a character device", src);
        }
        snprintf(dst, sizeof dst, "/dev/%s", devs[i]);
        bind_ro(src, dst, 1);
    }
    mount_proc();
    for (int i = 0; i < n_links; i++) {
        char target[MAX_PATH];
        parents(links[i].a);
        in_root(target, links[i].a);
        if (symlink(links[i].b, target) < 0)
            die("symlink %s", links[i].a);
    }
    if (mount(NULL, root_dir, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) < 0)
        die("make the cell's root read-only");
    if (chdir(root_dir) < 0)
        die("chdir %s", root_dir);
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        die("pivot_root");
    if (umount2(".", MNT_DETACH) < 0)
        die("detach the old root");
    if (chdir("/") < 0)
        die("chdir /");
}

static void drop_privileges(void) {
    for (int cap = 0; cap <= 63; cap++) {
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            die("drop capability %d from the bounding set", cap);
    }
    if (!userns) {
        if (setgroups(0, NULL) < 0)
            die("setgroups");
        if (setresgid((gid_t)gid, (gid_t)gid, (gid_t)gid) < 0)
            die("setresgid %ld", gid);
        if (setresuid((uid_t)uid, (uid_t)uid, (uid_t)uid) < 0)
            die("setresuid %ld", uid);
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        die("clear ambient capabilities");
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    memset(d, 0, sizeof d);
    if (syscall(SYS_capset, &h, d) < 0)
        die("capset");
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        die("no_new_privs");
}

static int by_number(const void *a, const void *b) {
    return *(const int *)a - *(const int *)b;
}

/* Close [lo, hi]: one close_range where the kernel has it (5.9+), else one at a time
 * (the daemon raises its descriptor limit, so a loop to it would be a million calls). */
static void close_between(unsigned lo, unsigned hi) {
    if (lo > hi)
        return;
#ifdef SYS_close_range
    if (syscall(SYS_close_range, lo, hi, 0) == 0)
        return;
#endif
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > (1 << 20))
        max = 1 << 20;
    for (unsigned fd = lo; fd <= hi && fd < (unsigned)max; fd++)
        close((int)fd);
}

static void close_others(void) {
    int keep[MAX_ITEMS + 1];
    int n = 0;
    for (int k = 0; k < n_keep; k++)
        keep[n++] = keep_fds[k];
    keep[n++] = errfd;
    qsort(keep, (size_t)n, sizeof keep[0], by_number);
    unsigned next = 3;
    for (int k = 0; k < n; k++) {
        if (keep[k] < 3)
            continue;
        close_between(next, (unsigned)keep[k] - 1);
        next = (unsigned)keep[k] + 1;
    }
    close_between(next, ~0U);
}

static void map_ids(uid_t outer_uid, gid_t outer_gid) {
    char line[64];
    write_file("/proc/self/setgroups", "deny");
    snprintf(line, sizeof line, "%u %u 1", (unsigned)outer_uid, (unsigned)outer_uid);
    write_file("/proc/self/uid_map", line);
    snprintf(line, sizeof line, "%u %u 1", (unsigned)outer_gid, (unsigned)outer_gid);
    write_file("/proc/self/gid_map", line);
    if (setresgid(outer_gid, outer_gid, outer_gid) < 0 ||
        setresuid(outer_uid, outer_uid, outer_uid) < 0)
        die("take the daemon's ids in the user namespace");
}

/* End as the VMM ended: its exit status, or its signal (no core of the jailer). */
__attribute__((noreturn)) static void end_like(int status) {
    if (WIFEXITED(status))
        _exit(WEXITSTATUS(status));
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    signal(sig, SIG_DFL);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_UNBLOCK, &all, NULL);
    kill(getpid(), sig);
    _exit(128 + sig);
}

int main(int argc, char **argv) {
    parse(argc, argv);
    uid_t outer_uid = getuid();
    gid_t outer_gid = getgid();
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
        die("PR_SET_PDEATHSIG");
    if (getppid() == 1)
        die("the daemon is gone");
    char pid[24];
    snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    for (int i = 0; i < n_cgroups; i++) {
        if (write(cgroup_fds[i], pid, strlen(pid)) < 0)
            die("join the VMM's cgroup (descriptor %d)", cgroup_fds[i]);
        close(cgroup_fds[i]);
    }
    if (userns) {
        if (unshare(CLONE_NEWUSER) < 0)
            die("unshare a user namespace");
        map_ids(outer_uid, outer_gid);
    }
    if (unshare(CLONE_NEWPID) < 0)
        die("unshare a PID namespace");
    int report[2], alive[2];
    if (pipe2(report, O_CLOEXEC) < 0 || pipe2(alive, O_CLOEXEC) < 0)
        die("pipe");
    pid_t child = fork();
    if (child < 0)
        die("fork");
    if (child == 0) {
        close(report[0]);
        close(alive[1]);
        errfd = report[1];
        if (hold_fd >= 0)
            close(hold_fd);
        make_cell();
        drop_privileges();
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
            die("PR_SET_PDEATHSIG in the cell");
        struct pollfd p = {alive[0], POLLIN, 0};
        if (poll(&p, 1, 0) != 0)
            die("the jailer is gone");
        close(alive[0]);
        close_others();
        if (no_exec)
            _exit(0);
        char *empty[] = {NULL};
        execve(program[0], program, empty);
        die("execve %s", program[0]);
    }
    close(report[1]);
    close(alive[0]);
    for (int k = 0; k < n_keep; k++)
        close(keep_fds[k]); /* the VMM's now: the jailer holds none of its disks or sockets */
    char msg[512];
    ssize_t got = 0, n;
    while ((n = read(report[0], msg + got, sizeof msg - 1 - (size_t)got)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        got += n;
        if ((size_t)got >= sizeof msg - 1)
            break;
    }
    close(report[0]);
    int status;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR)
            die("waitpid");
    }
    if (got > 0) {
        msg[got] = 0;
        dprintf(2, "tkbox-jailer: %s\n", msg);
        _exit(JAIL_FAILED);
    }
    end_like(status);
}
