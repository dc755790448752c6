/* vmm_probe: what an escaped VMM could reach, asked the way it would ask.
 *
 * tests/e2e/test_vmm_cell.py runs it twice: inside a VMM's cell exactly as the
 * jailer runs QEMU (bound at QEMU's own path, with QEMU's uid, namespaces, root,
 * cgroup and descriptors), and as the daemon itself. Each argument is one check;
 * each prints one line, "<check> ok" or "<check> err <errno>":
 *
 *   open:PATH    open(PATH, O_RDONLY)          unix:PATH   connect to a Unix socket
 *   stat:PATH    stat(PATH)                    tcp:IP:PORT connect over TCP (IPv4)
 *   kill:PID     kill(PID, 0)                  fd:N        fstat(N) (a descriptor handed)
 *   procs        how many processes /proc shows (printed as "procs N")
 *   whoami       "whoami UID GID"
 *   sleep:S      sleep S seconds (so the host can look at the probe while it runs)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static void report(const char *check, int rc) {
    if (rc == 0)
        printf("%s ok\n", check);
    else
        printf("%s err %s\n", check, strerrorname_np(errno) ? strerrorname_np(errno) : "?");
    fflush(stdout);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        int rc = -1;
        if (!strncmp(c, "open:", 5)) {
            int fd = open(c + 5, O_RDONLY | O_CLOEXEC);
            rc = fd < 0 ? -1 : 0;
            if (fd >= 0)
                close(fd);
        } else if (!strncmp(c, "stat:", 5)) {
            struct stat st;
            rc = stat(c + 5, &st);
        } else if (!strncmp(c, "unix:", 5)) {
            int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            struct sockaddr_un a = {.sun_family = AF_UNIX};
            strncpy(a.sun_path, c + 5, sizeof a.sun_path - 1);
            rc = connect(s, (struct sockaddr *)&a, sizeof a);
            close(s);
        } else if (!strncmp(c, "tcp:", 4)) {
            char ip[64];
            const char *colon = strrchr(c + 4, ':');
            size_t n = colon ? (size_t)(colon - (c + 4)) : 0;
            struct sockaddr_in a = {.sin_family = AF_INET};
            if (colon && n < sizeof ip) {
                memcpy(ip, c + 4, n);
                ip[n] = 0;
                a.sin_port = htons((unsigned short)atoi(colon + 1));
                if (inet_pton(AF_INET, ip, &a.sin_addr) == 1) {
                    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                    rc = connect(s, (struct sockaddr *)&a, sizeof a);
                    close(s);
                } else {
                    errno = EINVAL;
                }
            } else {
                errno = EINVAL;
            }
        } else if (!strncmp(c, "kill:", 5)) {
            rc = kill(atoi(c + 5), 0);
        } else if (!strncmp(c, "fd:", 3)) {
            struct stat st;
            rc = fstat(atoi(c + 3), &st);
        } else if (!strcmp(c, "procs")) {
            DIR *d = opendir("/proc");
            int count = 0;
            struct dirent *e;
            while (d && (e = readdir(d)))
                count += isdigit((unsigned char)e->d_name[0]) != 0;
            if (d)
                closedir(d);
            printf("procs %d\n", count);
            fflush(stdout);
            continue;
        } else if (!strcmp(c, "whoami")) {
            printf("whoami %d %d\n", (int)getuid(), (int)getgid());
            fflush(stdout);
            continue;
        } else if (!strncmp(c, "sleep:", 6)) {
            sleep((unsigned)atoi(c + 6));
            continue;
        } else {
            errno = EINVAL;
        }
        report(c, rc);
    }
    return 0;
}
