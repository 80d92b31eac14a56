#ifndef CGSSAPI_SHIM_H
#define CGSSAPI_SHIM_H
// MIT Kerberos' GSS-API (libkrb5-dev: pkg-config krb5-gssapi). Swift cannot use GSS-API's
// macros (status codes built by shifts, OIDs as extern variables, GSS_ERROR), so this shim
// names them as functions and constants, and wraps the few calls the daemon makes.
#include <gssapi/gssapi.h>
#include <gssapi/gssapi_krb5.h>
#include <krb5/krb5.h>
#include <stddef.h>
#include <string.h>

/// SPNEGO (RFC 4178), 1.3.6.1.5.5.2: the mechanism HTTP Negotiate speaks (RFC 4559).
static inline gss_OID cgss_spnego_mechanism(void) {
    static gss_OID_desc spnego = {6, (void *)"\x2b\x06\x01\x05\x05\x02"};
    return &spnego;
}

/// Kerberos V5 (RFC 1964), 1.2.840.113554.1.2.2.
static inline gss_OID cgss_krb5_mechanism(void) {
    static gss_OID_desc krb5 = {9, (void *)"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02"};
    return &krb5;
}

static inline int cgss_is_error(OM_uint32 major) { return GSS_ERROR(major) != 0; }
static inline int cgss_continue_needed(OM_uint32 major) { return (major & GSS_S_CONTINUE_NEEDED) != 0; }
static inline OM_uint32 cgss_routine_error(OM_uint32 major) { return GSS_ROUTINE_ERROR(major); }

enum {
    CGSS_S_NO_CRED = GSS_S_NO_CRED,
    CGSS_S_CREDENTIALS_EXPIRED = GSS_S_CREDENTIALS_EXPIRED,
    CGSS_S_DEFECTIVE_TOKEN = GSS_S_DEFECTIVE_TOKEN,
    CGSS_S_BAD_NAME = GSS_S_BAD_NAME,
    CGSS_S_FAILURE = GSS_S_FAILURE,
};

/// The Kerberos (mechanism) minor codes the daemon tells apart, as signed 32-bit values.
enum {
    CGSS_KRB5_FCC_NOFILE = (int)KRB5_FCC_NOFILE,
    CGSS_KRB5_CC_NOTFOUND = (int)KRB5_CC_NOTFOUND,
    CGSS_KRB5_CC_NOSUPP = (int)KRB5_CC_NOSUPP,
    CGSS_KRB5_KDC_UNREACH = (int)KRB5_KDC_UNREACH,
    CGSS_KRB5_REALM_CANT_RESOLVE = (int)KRB5_REALM_CANT_RESOLVE,
    CGSS_KRB5_REALM_UNKNOWN = (int)KRB5_REALM_UNKNOWN,
    CGSS_KRB5_TKT_EXPIRED = (int)KRB5KRB_AP_ERR_TKT_EXPIRED,
    CGSS_KRB5_SKEW = (int)KRB5KRB_AP_ERR_SKEW,
    CGSS_KRB5_S_PRINCIPAL_UNKNOWN = (int)KRB5KDC_ERR_S_PRINCIPAL_UNKNOWN,
};

/// Imports `HTTP@host` as a host-based service name (RFC 2743 §4.1).
static inline OM_uint32 cgss_import_service_name(OM_uint32 *minor, const char *service_at_host, gss_name_t *name) {
    gss_buffer_desc buffer = {strlen(service_at_host), (void *)service_at_host};
    return gss_import_name(minor, &buffer, GSS_C_NT_HOSTBASED_SERVICE, name);
}

/// The default credential (the credential cache `klist` shows) as a handle for Kerberos
/// initiators, released by the caller with gss_release_cred. Acquiring it once spares every
/// context the cache selection (`~/.k5identity`, the client keytab) a default credential costs.
static inline OM_uint32 cgss_acquire_default(OM_uint32 *minor, gss_cred_id_t *credential) {
    gss_OID_set_desc mechanisms = {1, cgss_krb5_mechanism()};
    return gss_acquire_cred(minor, GSS_C_NO_NAME, GSS_C_INDEFINITE, &mechanisms, GSS_C_INITIATE, credential, NULL, NULL);
}

/// One step of an initiator's SPNEGO context with `credential` (GSS_C_NO_CREDENTIAL: the
/// default): `input` is the server's token (NULL on the first step). The output token is the
/// caller's to release with gss_release_buffer.
static inline OM_uint32 cgss_init_step(
    OM_uint32 *minor, gss_cred_id_t credential, gss_ctx_id_t *context, gss_name_t target, OM_uint32 flags,
    const void *input, size_t input_length, gss_buffer_desc *output, OM_uint32 *returned_flags
) {
    gss_buffer_desc input_buffer = {input_length, (void *)input};
    return gss_init_sec_context(
        minor, credential, context, target, cgss_spnego_mechanism(), flags, GSS_C_INDEFINITE,
        GSS_C_NO_CHANNEL_BINDINGS, input == NULL ? GSS_C_NO_BUFFER : &input_buffer, NULL, output, returned_flags, NULL
    );
}

/// A credential's principal (released by the caller with gss_release_buffer) and its remaining
/// lifetime in seconds (0: expired).
static inline OM_uint32 cgss_inquire_credential(
    OM_uint32 *minor, gss_cred_id_t credential, gss_buffer_desc *principal, OM_uint32 *lifetime
) {
    gss_name_t name = GSS_C_NO_NAME;
    OM_uint32 major = gss_inquire_cred(minor, credential, &name, lifetime, NULL, NULL);
    if (!GSS_ERROR(major)) {
        major = gss_display_name(minor, name, principal, NULL);
    }
    OM_uint32 ignored;
    if (name != GSS_C_NO_NAME) {
        gss_release_name(&ignored, &name);
    }
    return major;
}

/// The text of one status code; `gss_code` 1 for a major code, 0 for a mechanism (minor) one.
/// The caller releases the buffer with gss_release_buffer.
static inline OM_uint32 cgss_status_text(OM_uint32 code, int gss_code, OM_uint32 *context, gss_buffer_desc *text) {
    OM_uint32 minor;
    return gss_display_status(&minor, code, gss_code ? GSS_C_GSS_CODE : GSS_C_MECH_CODE, cgss_krb5_mechanism(), context, text);
}

#endif
