/* JSON Schema front-end: a schema (drafts 4 to 2020-12, the commonly used subset) compiled to a
 * grammar of the JSON texts it accepts.
 *
 * Supported: type (single or list), boolean schemas, const, enum (any JSON values; serialized
 * compactly), anyOf, oneOf (as anyOf when the branches have distinct types, so exclusivity holds;
 * otherwise rejected unless opts.lenient_oneof), allOf (merged keyword-wise
 * when the parts do not conflict), local $ref ("#", "#/$defs/x", "#/definitions/x", any JSON
 * pointer into the document, including recursion), objects (properties, required,
 * additionalProperties true/false/schema), arrays (items, prefixItems, draft-4 tuple items,
 * additionalItems, minItems, maxItems), strings (minLength, maxLength, pattern, format: date-time,
 * date, time, email, uuid, ipv4, hostname, uri), numbers and integers (minimum >= 0 removes the
 * sign; other numeric bounds are rejected unless they are implied by the type).
 *
 * Output shape: object members appear in the schema's property order, additional members after
 * the declared ones with keys that differ from every declared name (and use no escapes);
 * numbers use the JSON grammar; whitespace follows di_json_schema_opts. The grammar accepts a
 * subset of the valid instances (e.g. one member order, compact const/enum spelling), never an
 * invalid one; known gap: minLength counts a \uD83D\uDE00 surrogate pair as two characters.
 *
 * Keywords that constrain the language but are not implemented (not, if/then/else, contains,
 * uniqueItems, multipleOf, min/maxProperties, patternProperties, dependent*, propertyNames,
 * unevaluated*, non-trivial numeric bounds, pattern together with length bounds) fail with
 * DI_ERR_UNSUPPORTED naming the keyword and its JSON pointer, so a mask never allows text the
 * schema rejects. Annotations (title, description, default, examples, $comment, ...) are ignored. */
#ifndef DI_GRAMMAR_JSON_SCHEMA_H
#define DI_GRAMMAR_JSON_SCHEMA_H

#include "grammar/grammar_impl.h"

#define DI_JSON_SCHEMA_MAX_DEPTH 128 /* nesting of subschemas (not $ref recursion) */

#endif
