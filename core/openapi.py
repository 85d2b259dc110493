"""What ``/schema/openapi.json`` says about answers, beyond what Litestar infers.

- :func:`error_responses`: the one error shape (``core.errors``) for each error
  status a handler can answer. Litestar would document its own shape for 400; the
  tenancy guard documents its 401 and 404 itself (``tenancy.guard``).
- :class:`NumberMaps`: a map whose values are a union with ``int | float`` (``attrs``)
  has ``number`` values, once. Litestar renders each member in a ``oneOf``, and an
  integer is both an ``integer`` and a ``number``: every integer failed the schema.
- :class:`StrictStructs`: a body Struct that refuses unknown fields
  (``forbid_unknown_fields``) says ``additionalProperties: false``; Litestar says nothing,
  so a schema-valid body with an extra field was refused.
- :func:`state_empty_values`: a query parameter whose schema admits ``""`` says
  ``allowEmptyValue: true``. Litestar says ``false`` of every one, while ``?until=`` or
  ``?query=`` means "none" to the handlers; believing it, schemathesis found no valid
  ``until`` to send (its pattern's one short match is ``""``) and sent an invalid one.
- :class:`ItemConstraints`: a string's ``msgspec.Meta`` constraints inside a container
  (``list[Sha1]``) reach the schema; Litestar reads them on a Struct's fields only, so
  ``chunks: [""]`` was schema-valid and refused by the same ``Meta`` when decoded.
- :func:`with_body`: a handler that reads its body itself (ingest's hot path, uploads
  spooled to disk) documents it anyway; Litestar documents a body only where it parses
  one, so schemathesis sent none and every such request was a 400. :func:`schema_of`
  gives a Struct's schema as msgspec states it, for those bodies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import (
    Components,
    OpenAPI,
    OpenAPIMediaType,
    OpenAPIType,
    Operation,
    Parameter,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.params import KwargDefinition
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

from core.errors import ErrorEnvelope

if TYPE_CHECKING:
    from litestar._openapi.schema_generation import SchemaCreator

_MEANING = {
    400: "The request is malformed; the error names the parameter, field or file",
    401: "No API key, or not a known one: send 'Authorization: Bearer <key>'",
    403: "The request's Origin is not in the project's allowedOrigins",
    404: "No such project for this key's tenant (another tenant's reads the same)",
    409: "The name is taken in this tenant",
    413: "The body (or a file in it) is over its size limit",
    415: "Unsupported Content-Type or Content-Encoding",
    429: "Over a limit; retry after the Retry-After header's seconds",
    503: "Storage is unreachable or the service is overloaded; retry after Retry-After",
}


SECURITY_SCHEME = "apiKey"
"""The schema's name for ``Authorization: Bearer <API key>``: each operation's
``security`` lists the scope it needs under it (none: any key)."""


def security_components() -> Components:
    return Components(security_schemes={SECURITY_SCHEME: SecurityScheme(
        type="http", scheme="bearer",
        description="An API key (btk_...). Each operation's security names the scope the "
                    "key needs: read, sourcemaps:write or admin (none listed: any key).")})


def error_responses(*statuses: int, described: dict[int, str] | None = None
                    ) -> dict[int, ResponseSpec]:
    """``responses=`` for a handler: the error shape, once per status it can answer
    (``described``: more statuses, or other words for one)."""
    meanings = {status: _MEANING[status] for status in statuses} | (described or {})
    return {status: ResponseSpec(ErrorEnvelope, description=meaning, generate_examples=False)
            for status, meaning in sorted(meanings.items())}


class NumberMaps(OpenAPISchemaPlugin):
    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        # The map, not its value type: Litestar looks a plugin's type up by name first,
        # and a union has none.
        inner = field_definition.inner_types
        if not field_definition.is_mapping or len(inner) != 2 or not inner[1].is_union:
            return False
        return int in inner[1].args and float in inner[1].args

    def to_openapi_schema(self, field_definition: FieldDefinition,
                          schema_creator: SchemaCreator) -> Schema:
        members = tuple(a for a in field_definition.inner_types[1].args if a is not int)
        value = schema_creator.for_field_definition(
            FieldDefinition.from_annotation(Union[members]))  # noqa: UP007
        return Schema(type=OpenAPIType.OBJECT, additional_properties=value)


class StrictStructs(StructSchemaPlugin):
    # Litestar's own Struct plugin (a private module: it has no public hook for this),
    # with the one thing it leaves out.
    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        return (super().is_plugin_supported_field(field_definition)
                and field_definition.type_.__struct_config__.forbid_unknown_fields)

    def to_openapi_schema(self, field_definition: FieldDefinition,
                          schema_creator: SchemaCreator) -> Schema:
        schema = super().to_openapi_schema(field_definition, schema_creator)
        schema.additional_properties = False
        # A body that must name at least this many of its fields says so (``min_fields``).
        schema.min_properties = getattr(field_definition.type_, "min_fields", None)
        return schema


def _string_meta(field_definition: FieldDefinition) -> msgspec.Meta | None:
    if field_definition.annotation is not str:
        return None
    return next((m for m in field_definition.metadata if isinstance(m, msgspec.Meta)), None)


class ItemConstraints(OpenAPISchemaPlugin):
    def is_plugin_supported_field(self, field_definition: FieldDefinition) -> bool:
        # A Struct's own field has them as its kwarg_definition already, rendered by Litestar.
        kwargs = field_definition.kwarg_definition
        return _string_meta(field_definition) is not None and (
            not isinstance(kwargs, KwargDefinition)
            or (kwargs.pattern is None and kwargs.max_length is None
                and kwargs.min_length is None))

    def to_openapi_schema(self, field_definition: FieldDefinition,
                          schema_creator: SchemaCreator) -> Schema:
        meta = _string_meta(field_definition)
        assert meta is not None
        return Schema(type=OpenAPIType.STRING, pattern=meta.pattern,
                      min_length=meta.min_length, max_length=meta.max_length)


def _admits_empty(schema: Schema | Reference) -> bool:
    if not isinstance(schema, Schema):
        return False
    if schema.one_of is not None:
        return any(_admits_empty(branch) for branch in schema.one_of)
    if schema.enum is not None:
        return "" in schema.enum
    return (schema.type == OpenAPIType.STRING and not schema.min_length
            and (schema.pattern is None or re.search(schema.pattern, "") is not None))


def state_empty_values(openapi: OpenAPI) -> None:
    for path_item in (openapi.paths or {}).values():
        for operation in (path_item.get, path_item.put, path_item.post, path_item.delete,
                          path_item.patch):
            for parameter in (operation.parameters or []) if operation else ():
                if (isinstance(parameter, Parameter) and parameter.param_in == "query"
                        and parameter.schema is not None and _admits_empty(parameter.schema)):
                    parameter.allow_empty_value = True


def with_body(content: dict[str, Schema], description: str) -> type[Operation]:
    """``operation_class=`` for a handler that reads its own body: the body it takes, by
    media type."""
    body = RequestBody(content={media: OpenAPIMediaType(schema=schema)
                                for media, schema in content.items()},
                       description=description, required=True)

    @dataclass  # so that __post_init__ runs: Operation's own __init__ calls none
    class WithBody(Operation):
        def __post_init__(self) -> None:
            self.request_body = body

    return WithBody


# JSON Schema keywords msgspec writes, as Litestar's Schema names them.
_KEYWORDS = {"title": "title", "properties": "properties", "required": "required",
             "items": "items", "anyOf": "any_of", "additionalProperties": "additional_properties",
             "default": "default", "pattern": "pattern", "maxItems": "max_items",
             "minItems": "min_items", "maxLength": "max_length", "minLength": "min_length",
             "enum": "enum", "description": "description"}


def schema_of(struct: type[msgspec.Struct]) -> Schema:
    """``struct``'s JSON schema as msgspec generates it (what its decoder accepts), with
    every ``$ref`` written out in place."""
    document = msgspec.json.schema(struct)
    defs: dict[str, Any] = document.get("$defs", {})

    def convert(node: Any) -> Any:
        if isinstance(node, list):
            return [convert(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return convert(defs[node["$ref"].rsplit("/", 1)[1]])
        fields: dict[str, Any] = {}
        for key, value in node.items():
            if key == "type":
                fields["type"] = OpenAPIType(value)
            elif key in ("properties",):
                fields["properties"] = {name: convert(v) for name, v in value.items()}
            elif key == "required":
                fields["required"] = list(value) or None
            else:
                fields[_KEYWORDS[key]] = convert(value)
        return Schema(**fields)

    converted: Schema = convert(document)
    return converted
