// libsecret for Swift: the library's variadic and macro-based API is unusable from Swift, so
// these static inline helpers expose the non-variadic (`v`) forms, the error quarks and the
// schemas AuthBroker uses.
#ifndef AUTHBROKER_CLIBSECRET_SHIM_H
#define AUTHBROKER_CLIBSECRET_SHIM_H

#include <libsecret/secret.h>
#include <string.h>

/// A string → string attribute table that owns its keys and values.
static inline GHashTable *authbroker_attributes_new(void) {
    return g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free);
}

static inline void authbroker_attributes_insert(GHashTable *table, const char *name, const char *value) {
    g_hash_table_insert(table, g_strdup(name), g_strdup(value));
}

/// `org.gnome.keyring.NetworkPassword`, as libsecret defines it (port is an integer).
static inline const SecretSchema *authbroker_network_schema(void) {
    return secret_get_schema(SECRET_SCHEMA_TYPE_COMPAT_NETWORK);
}

/// The NetworkPassword attributes without the `xdg:schema` restriction, for searching: entries
/// that other tools saved with the same attribute names but no schema, or the generic one
/// (`secret-tool store`), are found too.
static inline const SecretSchema *authbroker_network_schema_any_name(void) {
    static const SecretSchema schema = {
        "org.gnome.keyring.NetworkPassword",
        SECRET_SCHEMA_DONT_MATCH_NAME,
        {
            { "user", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { "domain", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { "object", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { "protocol", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { "port", SECRET_SCHEMA_ATTRIBUTE_INTEGER },
            { "server", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { "authtype", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { NULL, 0 },
        }
    };
    return &schema;
}

/// AuthBroker's own schema for client-identity private keys.
static inline const SecretSchema *authbroker_identity_schema(void) {
    static const SecretSchema schema = {
        "org.authbroker.Identity",
        SECRET_SCHEMA_NONE,
        {
            { "name", SECRET_SCHEMA_ATTRIBUTE_STRING },
            { NULL, 0 },
        }
    };
    return &schema;
}

static inline GQuark authbroker_secret_error_quark(void) { return SECRET_ERROR; }
static inline GQuark authbroker_dbus_error_quark(void) { return G_DBUS_ERROR; }
static inline GQuark authbroker_io_error_quark(void) { return G_IO_ERROR; }

/// The items of a search result, as `SecretItem *` (GList's data is untyped).
static inline SecretItem *authbroker_list_item(GList *link) {
    return SECRET_ITEM(link->data);
}

/// Frees a list returned by `secret_service_search_sync`, unreferencing every item.
static inline void authbroker_item_list_free(GList *list) {
    g_list_free_full(list, g_object_unref);
}

static inline void authbroker_object_unref(gpointer object) {
    g_object_unref(object);
}

/// `secret_value_new` copies the bytes into libsecret's secure (wiped on free) memory.
static inline SecretValue *authbroker_value_new(const void *bytes, gssize length, const char *content_type) {
    return secret_value_new((const gchar *)bytes, length, content_type);
}

#endif
