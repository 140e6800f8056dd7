"""Flattening and rebuilding of nested lists, tuples and dicts of tensors (sources, watch, results)."""


def flatten(structure):
    """The leaves of `structure` in a fixed order (dict entries by sorted key, as TensorFlow's nest)."""
    if not isinstance(structure, _NESTS):      # one leaf (a tensor): the commonest, at once
        return [structure]
    if _flat_sequence(structure):       # the common nest, at once
        return list(structure)
    leaves = []
    _flatten_into(structure, leaves)
    return leaves


_NESTS = (list, tuple, dict)


def _flat_sequence(s):
    """Whether `s` is a plain list or tuple of leaves."""
    if type(s) is not list and type(s) is not tuple:
        return False
    for item in s:
        if isinstance(item, _NESTS):
            return False
    return True


def _flatten_into(s, leaves):
    if isinstance(s, (list, tuple)):
        for item in s:
            _flatten_into(item, leaves)
    elif isinstance(s, dict):
        for key in sorted(s, key=_sort_key):
            _flatten_into(s[key], leaves)
    else:
        leaves.append(s)


def _sort_key(key):
    return (type(key).__name__, key) if not isinstance(key, (int, float)) else ("", key)


def pack_like(structure, leaves):
    """Rebuild `structure`'s shape with `leaves` (as returned in flatten's order)."""
    if not isinstance(structure, _NESTS):
        return leaves[0]
    if _flat_sequence(structure) and len(structure) == len(leaves):     # at once
        return list(leaves) if type(structure) is list else tuple(leaves)
    it = iter(leaves)
    return _pack(structure, it)


def _pack(s, it):
    if isinstance(s, (list, tuple)):
        items = [_pack(item, it) for item in s]
        if isinstance(s, list):
            return items
        return type(s)(*items) if hasattr(s, "_fields") else tuple(items)
    if isinstance(s, dict):
        packed = {key: _pack(s[key], it) for key in sorted(s, key=_sort_key)}
        return type(s)((key, packed[key]) for key in s)
    return next(it)
