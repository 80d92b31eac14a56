#ifndef CPAM_SHIM_H
#define CPAM_SHIM_H
// Linux-PAM's application API (libpam0g-dev). pam_start_confdir needs Linux-PAM >= 1.4.
#include <security/pam_appl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/// The i-th message of a conversation call. Linux-PAM passes an array of pointers
/// (`msg[i]`), not a pointer to an array as Solaris does; this is the one place that knows.
static inline const struct pam_message *cpam_message_at(const struct pam_message **messages, int index) {
    return messages[index];
}

/// A zeroed array of `count` responses from malloc, as PAM requires: PAM frees it and
/// every `resp` string in it. NULL when out of memory.
static inline struct pam_response *cpam_allocate_responses(int count) {
    return (struct pam_response *)calloc((size_t)count, sizeof(struct pam_response));
}

/// A NUL-terminated malloc'd copy of `length` bytes, for a `pam_response.resp` that PAM will
/// free. NULL when out of memory.
static inline char *cpam_copy_response(const unsigned char *bytes, size_t length) {
    char *copy = (char *)malloc(length + 1);
    if (copy == NULL) {
        return NULL;
    }
    if (length > 0) {
        memcpy(copy, bytes, length);
    }
    copy[length] = '\0';
    return copy;
}

/// Overwrites and frees an array of responses we built but will not hand to PAM (the
/// conversation failed part-way), so no answer is left behind in freed memory.
static inline void cpam_free_responses(struct pam_response *responses, int count) {
    if (responses == NULL) {
        return;
    }
    for (int i = 0; i < count; i++) {
        char *text = responses[i].resp;
        if (text != NULL) {
            explicit_bzero(text, strlen(text));
            free(text);
        }
    }
    free(responses);
}

/// Overwrites `length` bytes at `bytes` in a way the compiler may not optimise away.
static inline void cpam_wipe(void *bytes, size_t length) {
    if (bytes != NULL && length > 0) {
        explicit_bzero(bytes, length);
    }
}

#endif
