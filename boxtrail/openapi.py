"""What ``/schema/openapi.json`` says about answers, beyond what Litestar infers.

- :func:`error_responses`: the one error shape (``boxtrail.errors``) for each error
  status a handler can answer. Litestar would document its own shape for 400; the
  tenancy guard documents its 401 and 404 itself (``boxtrail.auth``).
- :class:`NumberMaps`: a map whose values are a union with ``int | float`` (``attrs``)
  has ``number`` values, once. Litestar renders each member in a ``oneOf``, and an
  integer is both an ``integer`` and a ``number``: every integer failed the schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIType, Schema
from litestar.plugins import OpenAPISchemaPlugin
from litestar.typing import FieldDefinition

from boxtrail.errors import ErrorEnvelope

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
