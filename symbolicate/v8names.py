"""What V8 calls a function, read from the original source's tree (tree-sitter): the
naming rules ``symbolicate.scopes`` lists, applied to one function node at a time."""

from __future__ import annotations

from collections.abc import Iterator

from tree_sitter import Node

_WRAPPERS = frozenset(("parenthesized_expression", "as_expression", "satisfies_expression",
                       "non_null_expression", "type_assertion"))
_MAX_NAMING_DEPTH = 16
_CLASSES = frozenset(("class_declaration", "class", "abstract_class_declaration"))


def _is(parent: Node, field: str, child: Node) -> bool:
    found = parent.child_by_field_name(field)
    return found is not None and found.id == child.id


def modifiers(node: Node) -> Iterator[str]:
    for child in node.children:
        if not child.is_named:
            yield child.type


class Namer:
    """Names functions from the tree of one source (``data``: its UTF-16 bytes; a tree
    parsed through a callback holds no text of its own)."""

    def __init__(self, data: bytes, parents: dict[int, Node]) -> None:
        self.data = data
        self.parents = parents

    def _parent(self, node: Node) -> Node | None:
        return self.parents.get(node.id)

    def invoked(self, node: Node) -> int:
        """1 for the function of ``(function () {...})()`` or ``(() => {...})()``, else 0."""
        parent, child = self._up(node)
        return int(parent is not None and parent.type == "call_expression"
                   and _is(parent, "function", child) and node.end_point[1] >= 2)

    def _up(self, node: Node) -> tuple[Node | None, Node]:
        """The first parent that is not a parenthesis or a type assertion, and its child on
        the way (the node as that parent sees it)."""
        child, parent = node, self._parent(node)
        while parent is not None and parent.type in _WRAPPERS:
            child, parent = parent, self._parent(parent)
        return parent, child

    def _text(self, node: Node | None) -> str | None:
        if node is None:
            return None
        return self.data[node.start_byte:node.end_byte].decode("utf-16-le", "surrogatepass")

    def _key(self, node: Node | None) -> tuple[str | None, bool]:
        """A property key's name, and whether it is an identifier (V8 qualifies only those)."""
        if node is None:
            return None, False
        kind = node.type
        if kind in ("property_identifier", "identifier", "shorthand_property_identifier"):
            return self._text(node), True
        if kind == "private_property_identifier":
            return self._text(node), False
        if kind == "string":
            return "".join(self._text(c) or "" for c in node.named_children
                           if c.type in ("string_fragment", "escape_sequence")), False
        if kind == "number":
            return self._text(node), False
        if kind == "computed_property_name":
            inner = node.named_children[0] if node.named_children else None
            if inner is not None and inner.type in ("string", "number"):
                return self._key(inner)
            return None, False  # decided when the code runs
        return self._text(node), False

    def _member_path(self, node: Node) -> str | None:
        """V8's inferred name for ``a.b["c"] = function () {}``: ``a.b.c``; parts that are not
        names or literals are left out, ``this`` too."""
        parts: list[str] = []
        for _ in range(64):
            if node.type == "member_expression":
                prop = node.child_by_field_name("property")
                if prop is not None:
                    parts.append(self._text(prop) or "")
                node = node.child_by_field_name("object") or node
            elif node.type == "subscript_expression":
                key, _ = self._key(node.child_by_field_name("index"))
                if key is not None:
                    parts.append(key)
                node = node.child_by_field_name("object") or node
            else:
                break
        if node.type == "identifier":
            parts.append(self._text(node) or "")
        return ".".join(reversed(parts)) or None

    def _enclosing_owner(self, node: Node, depth: int) -> str | None:
        """For ``this.x = ...``: the class (or the function, for a constructor function) whose
        instances ``this`` is, by V8's receiver type name."""
        parent = self._parent(node)
        for _ in range(4096):
            if parent is None:
                return None
            if parent.type in _CLASSES:
                return self._class_name(parent, depth + 1)
            if parent.type in ("function_declaration", "function_expression"):
                return (self._text(parent.child_by_field_name("name"))
                        or self._assigned_name(parent, depth + 1))
            parent = self._parent(parent)
        return None

    def _assigned_name(self, node: Node, depth: int = 0) -> str | None:
        """The name an anonymous function or class takes from where it is written, or None.
        ``depth``: classes and functions named through one another so far (``this.a = class
        {...}`` inside ``this.b = class {...}``); past :data:`_MAX_NAMING_DEPTH` the owner is
        left out."""
        if depth > _MAX_NAMING_DEPTH:
            return None
        parent, child = self._up(node)
        if parent is None:
            return None
        kind = parent.type
        if kind == "variable_declarator" and _is(parent, "value", child):
            name = parent.child_by_field_name("name")
            return self._text(name) if name is not None and name.type == "identifier" else None
        if kind in ("assignment_expression", "assignment_pattern") and _is(parent, "right", child):
            left = parent.child_by_field_name("left")
            if left is None:
                return None
            if left.type in ("identifier", "shorthand_property_identifier_pattern"):
                return self._text(left)
            if left.type == "member_expression":
                obj = left.child_by_field_name("object")
                if obj is not None and obj.type == "this":
                    prop = self._text(left.child_by_field_name("property"))
                    owner = self._enclosing_owner(parent, depth)
                    return f"{owner}.{prop}" if owner and prop else prop
                return self._member_path(left)
            if left.type == "subscript_expression":
                return self._member_path(left)
            return None
        if kind == "pair" and _is(parent, "value", child):
            key, plain = self._key(parent.child_by_field_name("key"))
            if key is None:
                return None
            return f"Object.{key}" if plain else key
        if kind in ("field_definition", "public_field_definition") and (
                _is(parent, "value", child)):
            key, _ = self._key(parent.child_by_field_name("property")
                          or parent.child_by_field_name("name"))
            owner = self._owner_class(parent, depth + 1)
            return f"{owner}.{key}" if owner and key else key
        if kind == "export_statement" and _is(parent, "value", child):
            return "default"
        return None

    def _owner_class(self, member: Node, depth: int = 0) -> str | None:
        body = self._parent(member)
        owner = None if body is None else self._parent(body)
        if body is not None and body.type == "class_body" and owner is not None:
            return self._class_name(owner, depth)
        return None

    def _class_name(self, node: Node, depth: int) -> str | None:
        name = node.child_by_field_name("name")
        if name is not None:
            return self._text(name)
        assigned = self._assigned_name(node, depth)
        return assigned.rpartition(".")[2] if assigned else None

    def _method_name(self, node: Node) -> str | None:
        key, plain = self._key(node.child_by_field_name("name"))
        if key is None:
            return None
        marks = set(modifiers(node))
        body = self._parent(node)
        if body is not None and body.type == "class_body":
            owner = self._owner_class(node)
            if key == "constructor" and "static" not in marks and \
                    node.child_by_field_name("name").type == "property_identifier":  # type: ignore[union-attr]
                return owner or key
            for accessor in ("get", "set"):
                if accessor in marks:
                    return f"{accessor} {key}"
            if key.startswith("#"):
                return key
            return f"{owner}.{key}" if owner else key
        for accessor in ("get", "set"):
            if accessor in marks:
                return f"{accessor} {key}"
        return f"Object.{key}" if plain else key

    def key_of(self, node: Node) -> str | None:
        """The property key a function is named by (minifiers keep property names, not
        bindings): a method's, an object key's or a class field's, or the last property of
        a member it is assigned to; None for a constructor or a binding's name."""
        if node.type == "method_definition":
            name = node.child_by_field_name("name")
            key, _ = self._key(name)
            body = self._parent(node)
            if key == "constructor" and body is not None and body.type == "class_body":
                return None
            return key
        parent, child = self._up(node)
        if parent is None:
            return None
        if parent.type == "pair" and _is(parent, "value", child):
            return self._key(parent.child_by_field_name("key"))[0]
        if parent.type in ("field_definition", "public_field_definition") and (
                _is(parent, "value", child)):
            return self._key(parent.child_by_field_name("property")
                             or parent.child_by_field_name("name"))[0]
        if parent.type in ("assignment_expression", "assignment_pattern") and (
                _is(parent, "right", child)):
            left = parent.child_by_field_name("left")
            if left is not None and left.type == "member_expression":
                return self._text(left.child_by_field_name("property"))
            if left is not None and left.type == "subscript_expression":
                return self._key(left.child_by_field_name("index"))[0]
        return None

    def name_of(self, node: Node) -> str | None:
        kind = node.type
        if kind == "method_definition":
            return self._method_name(node)
        own = self._text(node.child_by_field_name("name"))
        if kind in ("function_declaration", "generator_function_declaration"):
            return own
        assigned = self._assigned_name(node)
        if own is None:
            return assigned
        # A named function expression keeps its name, qualified as its property would be.
        if assigned is not None and assigned.startswith("Object."):
            return f"Object.{own}"
        return own
