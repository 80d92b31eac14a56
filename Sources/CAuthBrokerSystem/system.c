#define _GNU_SOURCE
#include "CAuthBrokerSystem.h"
#include <errno.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sys/stat.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <signal.h>
#include <termios.h>
#include <unistd.h>

_Static_assert(sizeof(cab_ucred) == sizeof(struct ucred), "cab_ucred must mirror struct ucred");

int cab_sol_socket(void) { return SOL_SOCKET; }
int cab_so_peercred(void) { return SO_PEERCRED; }

int cab_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        return errno;
    }
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}

int cab_disable_core_files(void) {
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) {
        return errno;
    }
    return 0;
}

int cab_disable_core_dumps(void) {
    int failed = cab_disable_core_files();
    if (failed != 0) {
        return failed;
    }
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
        return errno;
    }
    return 0;
}

int cab_sd_notify(const char *state) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (path == NULL || path[0] == '\0') {
        return 1;
    }
    size_t length = strlen(path);
    struct sockaddr_un address;
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    if (length >= sizeof(address.sun_path)) {
        return ENAMETOOLONG;
    }
    memcpy(address.sun_path, path, length);
    // A leading '@' names a socket in the abstract namespace (sd_notify(3)).
    if (address.sun_path[0] == '@') {
        address.sun_path[0] = '\0';
    }
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return errno;
    }
    socklen_t addressLength = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + length);
    ssize_t sent = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&address, addressLength);
    int result = sent < 0 ? errno : 0;
    close(fd);
    return result;
}

int cab_unix_socket_is_live(const char *path) {
    struct sockaddr_un address;
    memset(&address, 0, sizeof(address));
    address.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(address.sun_path)) {
        return -ENAMETOOLONG;
    }
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    int result;
    if (connect(fd, (struct sockaddr *)&address, sizeof(address)) == 0) {
        result = 1;
    } else if (errno == ECONNREFUSED || errno == ENOENT) {
        result = 0;
    } else {
        result = -errno;
    }
    close(fd);
    return result;
}

int cab_file_owner_mode(const char *path, int follow, uid_t *uid, uint32_t *mode) {
    struct stat info;
    int result = follow ? stat(path, &info) : lstat(path, &info);
    if (result != 0) return errno;
    *uid = info.st_uid;
    *mode = (uint32_t)info.st_mode;
    return 0;
}

int cab_malloc_trim(void) {
#if defined(__GLIBC__)
    return malloc_trim(0);
#else
    return 0;
#endif
}

int cab_tcp_socket_owner(int family, const uint8_t *src, uint16_t src_port, const uint8_t *dst,
                         uint16_t dst_port, uint32_t *uid, uint64_t *inode) {
    size_t length;
    if (family == AF_INET) {
        length = 4;
    } else if (family == AF_INET6) {
        length = 16;
    } else {
        return EAFNOSUPPORT;
    }
    struct {
        struct nlmsghdr header;
        struct inet_diag_req_v2 request;
    } message;
    memset(&message, 0, sizeof(message));
    message.header.nlmsg_len = sizeof(message);
    message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    message.header.nlmsg_flags = NLM_F_REQUEST;
    message.header.nlmsg_seq = 1;
    message.request.sdiag_family = (uint8_t)family;
    message.request.sdiag_protocol = IPPROTO_TCP;
    message.request.idiag_states = ~0U;
    message.request.id.idiag_sport = htons(src_port);
    message.request.id.idiag_dport = htons(dst_port);
    memcpy(message.request.id.idiag_src, src, length);
    memcpy(message.request.id.idiag_dst, dst, length);
    message.request.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
    message.request.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;

    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0) {
        return errno;
    }
    struct sockaddr_nl kernel;
    memset(&kernel, 0, sizeof(kernel));
    kernel.nl_family = AF_NETLINK;
    if (sendto(fd, &message, sizeof(message), 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0) {
        int error = errno;
        close(fd);
        return error;
    }
    // One answer: an inet_diag_msg, or an error (ENOENT when no socket has these addresses).
    long buffer[2048 / sizeof(long)];
    ssize_t received;
    do {
        received = recv(fd, buffer, sizeof(buffer), 0);
    } while (received < 0 && errno == EINTR);
    int error = received < 0 ? errno : 0;
    close(fd);
    if (error != 0) {
        return error;
    }
    struct nlmsghdr *header = (struct nlmsghdr *)buffer;
    if (!NLMSG_OK(header, (size_t)received)) {
        return EPROTO;
    }
    if (header->nlmsg_type == NLMSG_ERROR) {
        struct nlmsgerr *failure = (struct nlmsgerr *)NLMSG_DATA(header);
        return failure->error < 0 ? -failure->error : EPROTO;
    }
    if (header->nlmsg_type != SOCK_DIAG_BY_FAMILY || header->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg))) {
        return EPROTO;
    }
    struct inet_diag_msg *found = (struct inet_diag_msg *)NLMSG_DATA(header);
    // The kernel matched these exactly; checked again so a surprise never names the wrong owner.
    if (found->id.idiag_sport != htons(src_port) || found->id.idiag_dport != htons(dst_port) ||
        memcmp(found->id.idiag_src, src, length) != 0 || memcmp(found->id.idiag_dst, dst, length) != 0) {
        return EPROTO;
    }
    *uid = found->idiag_uid;
    *inode = found->idiag_inode;
    return 0;
}

/// Whether the process `name` (a directory of /proc, opened as `proc`) belongs to `uid` and
/// holds the descriptor whose link reads `wanted`.
static int process_holds(int proc, const char *name, uint32_t uid, const char *wanted, int wanted_length) {
    struct stat status;
    if (fstatat(proc, name, &status, 0) != 0 || status.st_uid != uid) {
        return 0;
    }
    char path[64];
    snprintf(path, sizeof(path), "%s/fd", name);
    int fds = openat(proc, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds < 0) {
        return 0;
    }
    DIR *entries = fdopendir(fds);
    if (entries == NULL) {
        close(fds);
        return 0;
    }
    int found = 0;
    struct dirent *entry;
    while (!found && (entry = readdir(entries)) != NULL) {
        char target[64];
        ssize_t length = readlinkat(dirfd(entries), entry->d_name, target, sizeof(target));
        found = length == wanted_length && memcmp(target, wanted, (size_t)length) == 0;
    }
    closedir(entries);
    return found;
}

static int descending_pid(const void *left, const void *right) {
    int32_t a = *(const int32_t *)left, b = *(const int32_t *)right;
    return (a < b) - (a > b);
}

int cab_socket_inode_pid(uint64_t inode, uint32_t uid, int32_t hint, int32_t *pid) {
    char wanted[64];
    int wanted_length = snprintf(wanted, sizeof(wanted), "socket:[%llu]", (unsigned long long)inode);
    DIR *processes = opendir("/proc");
    if (processes == NULL) {
        return errno;
    }
    char hint_name[16];
    hint_name[0] = 0;
    if (hint > 0) {
        snprintf(hint_name, sizeof(hint_name), "%d", (int)hint);
        if (process_holds(dirfd(processes), hint_name, uid, wanted, wanted_length)) {
            *pid = hint;
            closedir(processes);
            return 0;
        }
    }
    // The user's processes, newest (highest pid) first: a program that just started is the
    // likeliest to have opened a new connection, and each table read costs a readlink per
    // descriptor, far more than the listing.
    int32_t *pids = NULL;
    size_t count = 0, capacity = 0;
    struct dirent *process;
    while ((process = readdir(processes)) != NULL) {
        if (process->d_name[0] < '1' || process->d_name[0] > '9' || strcmp(process->d_name, hint_name) == 0) {
            continue;
        }
        if (count == capacity) {
            size_t grown = capacity == 0 ? 256 : capacity * 2;
            int32_t *larger = realloc(pids, grown * sizeof(int32_t));
            if (larger == NULL) {
                break;  // out of memory: look through the ones listed so far
            }
            pids = larger;
            capacity = grown;
        }
        pids[count++] = (int32_t)strtol(process->d_name, NULL, 10);
    }
    if (count > 1) {
        qsort(pids, count, sizeof(int32_t), descending_pid);
    }
    int result = ENOENT;
    for (size_t index = 0; index < count; index++) {
        char name[16];
        snprintf(name, sizeof(name), "%d", (int)pids[index]);
        if (process_holds(dirfd(processes), name, uid, wanted, wanted_length)) {
            *pid = pids[index];
            result = 0;
            break;
        }
    }
    free(pids);
    closedir(processes);
    return result;
}

// The terminal a prompt turned echo off on, its settings before and during the prompt: read
// by the signal handler, so plain statics set before the handlers are installed (one prompt at
// a time: a second one while one is open gets EBUSY).
static volatile sig_atomic_t cab_tty_fd = -1;
static struct termios cab_tty_saved;
static struct termios cab_tty_quiet;
static const int cab_tty_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGTTIN, SIGTTOU};
#define CAB_TTY_SIGNAL_COUNT (sizeof(cab_tty_signals) / sizeof(cab_tty_signals[0]))
static struct sigaction cab_tty_previous[CAB_TTY_SIGNAL_COUNT];

static void cab_tty_signalled(int signal_number) {
    // Only async-signal-safe calls: tcsetattr, write, sigaction, raise; errno kept for the
    // read this interrupted.
    int saved_errno = errno;
    int fd = cab_tty_fd;
    // Only in the foreground: in the background the terminal is the shell's (a stopped and
    // `bg`ed prompt must not write on it; its next read stops it again, in the foreground).
    int foreground = fd >= 0 && tcgetpgrp(fd) == getpgrp();
    if (foreground) {
        tcsetattr(fd, TCSANOW, &cab_tty_saved);
        (void)!write(fd, "\n", 1);
    }
    size_t index = 0;
    while (index < CAB_TTY_SIGNAL_COUNT && cab_tty_signals[index] != signal_number) index++;
    struct sigaction ours;
    sigaction(signal_number, &cab_tty_previous[index], &ours);
    // The signal does what it did before, now: end the process, or stop it (Ctrl-Z: the shell
    // shows the terminal as it was, echo on). Unblocked first, or it would wait for this
    // handler to return, and find it installed again.
    sigset_t just_this;
    sigemptyset(&just_this);
    sigaddset(&just_this, signal_number);
    sigprocmask(SIG_UNBLOCK, &just_this, NULL);
    raise(signal_number);
    // Still here: stopped and continued (fg), or a handler of the process's own ran. The prompt
    // goes on with echo off again.
    sigaction(signal_number, &ours, NULL);
    if (fd >= 0 && cab_tty_fd == fd && tcgetpgrp(fd) == getpgrp()) tcsetattr(fd, TCSANOW, &cab_tty_quiet);
    errno = saved_errno;
}

int cab_tty_echo_off(int fd) {
    if (cab_tty_fd >= 0) return EBUSY;
    if (tcgetattr(fd, &cab_tty_saved) != 0) return errno;
    cab_tty_quiet = cab_tty_saved;
    cab_tty_quiet.c_lflag &= ~(tcflag_t)ECHO;
    cab_tty_fd = fd;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = cab_tty_signalled;
    // A read or tcsetattr a stop interrupted goes on after `fg`.
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    for (size_t index = 0; index < CAB_TTY_SIGNAL_COUNT; index++) {
        sigaction(cab_tty_signals[index], NULL, &cab_tty_previous[index]);
        // An ignored signal stays ignored (under nohup, say): it neither ends nor stops the
        // prompt, so echo must stay off through it.
        if (cab_tty_previous[index].sa_handler == SIG_IGN) continue;
        sigaction(cab_tty_signals[index], &action, NULL);
    }
    int set;
    do {
        set = tcsetattr(fd, TCSAFLUSH, &cab_tty_quiet);
    } while (set != 0 && errno == EINTR);
    if (set != 0) {
        int error = errno;
        cab_tty_echo_restore();
        return error;
    }
    return 0;
}

void cab_tty_echo_restore(void) {
    int fd = cab_tty_fd;
    if (fd < 0) return;
    // The signals wait while the terminal and their actions are put back: one in between would
    // meet the previous action with echo still off.
    sigset_t guarded, before;
    sigemptyset(&guarded);
    for (size_t index = 0; index < CAB_TTY_SIGNAL_COUNT; index++) sigaddset(&guarded, cab_tty_signals[index]);
    sigprocmask(SIG_BLOCK, &guarded, &before);
    while (tcsetattr(fd, TCSAFLUSH, &cab_tty_saved) != 0 && errno == EINTR) {}
    cab_tty_fd = -1;
    for (size_t index = 0; index < CAB_TTY_SIGNAL_COUNT; index++) {
        sigaction(cab_tty_signals[index], &cab_tty_previous[index], NULL);
    }
    sigprocmask(SIG_SETMASK, &before, NULL);
}
