/* JSON Schema front-end: a schema (drafts 4 to 2020-12, the commonly used subset) compiled to a
 * grammar of the JSON texts it accepts.
 *
 * Supported: type (single or list), boolean schemas, const, enum (any JSON values; serialized
 * compactly), anyOf, oneOf (as anyOf when no value can match two branches: types that do not
 * overlap, const/enum values that fail every other branch, or a required property whose schemas
 * are disjoint, e.g. a "kind" const discriminator, or one forbids a name the other requires;
 * branches that differ by required names are narrowed to forbid the others' names first;
 * otherwise rejected unless opts.lenient_oneof),
 * allOf (merged keyword-wise when the parts do not conflict; differing annotations are ignored;
 * a property constrained by two parts takes allOf of both),
 * local $ref ("#", "#/$defs/x", "#/definitions/x", any JSON pointer into the document, including
 * recursion; constraining siblings are applied as allOf), objects (properties, required,
 * additionalProperties true/false/schema, patternProperties when at most one distinct non-trivial
 * schema is attached and no declared name matching a pattern has another schema, minProperties
 * implied by required names or equal to 1, maxProperties implied by a closed property list),
 * dependencies / dependentRequired (the dependent names become required: a subset) and
 * dependentSchemas (when the trigger is required), not (of a type, of required names, of
 * enum/const values beside enum/const, true/false), arrays (items, prefixItems, draft-4 tuple
 * items, additionalItems, minItems, maxItems), strings (minLength, maxLength, pattern, format:
 * date-time, date, time, email, uuid, ipv4, hostname, uri; length bounds beside a pattern/format
 * when implied by its shortest match or when the pattern is one repeated atom such as
 * ^[a-z0-9]+$), numbers and integers (bounds, fractional ones included, as exact decimal languages;
 * multipleOf as a residue automaton of at most 1,000 states and 15 digits: json_schema_number.c),
 * if/then/else, not (types, values, required names also inside allOf/anyOf, one-property
 * properties, strings beside a plain string type), min/maxProperties (counted member chain),
 * propertyNames (false, or a pattern without declared properties).
 *
 * Output shape: object members appear in the schema's property order, additional members after
 * the declared ones with keys that differ from every declared name (and use no escapes);
 * numbers use the JSON grammar; whitespace follows di_json_schema_opts. The grammar accepts a
 * subset of the valid instances (e.g. one member order, compact const/enum spelling), never an
 * invalid one; known gap: minLength counts a \uD83D\uDE00 surrogate pair as two characters.
 * Pattern checks made at compile time (a declared name against patternProperties, an enum value
 * against a oneOf branch's pattern) use PCRE2, whose syntax covers the supported regex subset.
 *
 * Keywords that constrain the language but are not implemented (contains, uniqueItems,
 * unevaluated*, other forms of the keywords above) fail
 * with DI_ERR_UNSUPPORTED naming the keyword and its JSON pointer, so a mask never allows text the
 * schema rejects. Annotations (title, description, default, examples, $comment, ...) are ignored. */
#ifndef DI_GRAMMAR_JSON_SCHEMA_H
#define DI_GRAMMAR_JSON_SCHEMA_H

#include "grammar/grammar_impl.h"

#define DI_JSON_SCHEMA_MAX_DEPTH 128 /* nesting of subschemas (not $ref recursion) */

#endif
