/* tkbox-spawn: the step between the guest agent and a command (tkbox.guest.agent.spawn).
 *
 * The agent starts this small static program with vfork+exec (CPython does so when
 * there is no preexec_fn), so the agent's own 40 MiB image is never forked: under
 * software emulation that fork, not the command, was most of an `exec`. This
 * program then does, in this order, what the command must have before any of its
 * own code runs, and execs it:
 *
 *   1. join the commands' memory cgroup (write our pid to its cgroup.procs), so the
 *      command is confined from its first instruction;
 *   2. with a terminal, take fd 0 as the controlling terminal (the agent's vfork
 *      child already called setsid());
 *   3. chroot into the box's root;
 *   4. with a user: setgroups, setgid, setuid (after chroot, which needs root;
 *      before chdir, so the directory is entered with the user's own rights);
 *   5. chdir to the working directory;
 *   6. execve the command, searching the command's own PATH as CPython's
 *      subprocess does (each PATH entry in turn; the first error that is not
 *      ENOENT/ENOTDIR is the one reported).
 *
 * Its own environment is empty (nothing, GLIBC_TUNABLES included, steers it while
 * it is still root); the command's environment comes as arguments. Any failure is
 * written as "<errno> <step>" to ERRFD, which is close-on-exec: the agent reads
 * end-of-file when the command started, and the reason when it did not.
 *
 *   tkbox-spawn ERRFD PROCS ROOT CWD UID GID GROUPS TTY NENV ENV... -- ARGV...
 *
 * PROCS is "" for no cgroup; UID is "" for no user change (then GID and GROUPS are
 * ignored); GROUPS is a comma-separated list ("" for none); TTY is "0" or "1".
 * The agent is the only caller; anything malformed is refused (EINVAL, "usage").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define MAX_GROUPS 64
#define MAX_ENV 65536

static int errfd = -1;

static void fail(const char *step) {
    int e = errno;
    char buf[96];
    int n = snprintf(buf, sizeof buf, "%d %s", e, step);
    if (errfd >= 0 && n > 0 && n < (int)sizeof buf) {
        ssize_t w = write(errfd, buf, (size_t)n);
        (void)w;
    }
    _exit(127);
}

static void usage(void) {
    errno = EINVAL;
    fail("usage");
}

/* A decimal in [0, max], digits only, no sign, no leading zero but "0" itself. */
static long number(const char *s, long max) {
    long v = 0;
    if (s[0] == '\0' || (s[0] == '0' && s[1] != '\0')) usage();
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9') usage();
        v = v * 10 + (*p - '0');
        if (v > max) usage();
    }
    return v;
}

static void join_cgroup(const char *procs) {
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%d", (int)getpid());
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail("cgroup");
    if (write(fd, pid, (size_t)n) != n) fail("cgroup");
    close(fd);
}

static void become(const char *uid_s, const char *gid_s, const char *groups_s) {
    gid_t groups[MAX_GROUPS];
    size_t n = 0;
    char buf[MAX_GROUPS * 12];
    if (strlen(groups_s) >= sizeof buf) usage();
    strcpy(buf, groups_s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (n == MAX_GROUPS) usage();
        groups[n++] = (gid_t)number(tok, 0xfffffffeL);
    }
    uid_t uid = (uid_t)number(uid_s, 0xfffffffeL);
    gid_t gid = (gid_t)number(gid_s, 0xfffffffeL);
    if (setgroups(n, groups) < 0) fail("setgroups");
    if (setgid(gid) < 0) fail("setgid");
    if (setuid(uid) < 0) fail("setuid");
}

static const char *env_path(char **envp) {
    for (char **e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) return *e + 5;
    return "/bin:/usr/bin"; /* os.defpath */
}

static void run(char **argv, char **envp) {
    const char *name = argv[0];
    if (name[0] == '\0') {
        errno = ENOENT;
        fail("exec");
    }
    if (strchr(name, '/')) {
        execve(name, argv, envp);
        fail("exec");
    }
    int saved = 0;
    char full[PATH_MAX];
    const char *p = env_path(envp);
    for (;;) {
        const char *end = strchrnul(p, ':');
        size_t len = (size_t)(end - p);
        int n = len ? snprintf(full, sizeof full, "%.*s/%s", (int)len, p, name)
                    : snprintf(full, sizeof full, "%s", name);
        if (n > 0 && (size_t)n < sizeof full) {
            execve(full, argv, envp);
            if (errno != ENOENT && errno != ENOTDIR && saved == 0) saved = errno;
        }
        if (*end == '\0') break;
        p = end + 1;
    }
    errno = saved ? saved : ENOENT;
    fail("exec");
}

int main(int argc, char **argv) {
    if (argc < 12) usage();
    errfd = (int)number(argv[1], INT_MAX);
    if (fcntl(errfd, F_SETFD, FD_CLOEXEC) < 0) {
        errfd = -1;
        fail("errfd");
    }
    const char *procs = argv[2], *root = argv[3], *cwd = argv[4];
    const char *uid = argv[5], *gid = argv[6], *groups = argv[7], *tty = argv[8];
    long nenv = number(argv[9], MAX_ENV);
    if (strcmp(tty, "0") != 0 && strcmp(tty, "1") != 0) usage();
    if (10 + nenv + 2 > argc || strcmp(argv[10 + nenv], "--") != 0) usage();
    char **envp = &argv[10];
    argv[10 + nenv] = NULL; /* ends envp; the command's argv follows */
    char **cmd = &argv[10 + nenv + 1];

    if (procs[0]) join_cgroup(procs);
    if (tty[0] == '1' && ioctl(0, TIOCSCTTY, 0) < 0) fail("tty");
    if (chroot(root) < 0) fail("chroot");
    if (uid[0]) become(uid, gid, groups);
    if (chdir(cwd) < 0) fail("chdir");
    run(cmd, envp);
    return 127;
}
