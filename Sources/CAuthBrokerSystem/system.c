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

int cab_disable_core_dumps(void) {
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) {
        return errno;
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
