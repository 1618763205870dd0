"""The small functions a generated module defines for the ops it uses: each is the maths of
rnn2jax's lowering of one op (rnn2jax/ops), without the argument and shape checks (the generator ran
those when it read the net). Listed by name with the helpers each one calls."""

from __future__ import annotations

HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {}


def _helper(name: str, source: str, *needs: str) -> None:
    HELPERS[name] = (source.strip("\n"), needs)


_helper(
    "fc",
    '''
def fc(x, w, b, axis=1, axis_w=1):
    """Caffe2's FC: x viewed as [M, K] at `axis`, w as [N, K] at `axis_w`; y = x @ w.T + b, keeping x's
    dims before `axis`."""
    axis, axis_w = axis % x.ndim, axis_w % w.ndim
    w2 = jnp.reshape(w, (math.prod(w.shape[:axis_w]), math.prod(w.shape[axis_w:])))
    x2 = jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    y = jnp.matmul(x2, w2.T, precision=HIGHEST) + b
    return jnp.reshape(y, (*x.shape[:axis], w2.shape[0]))
''',
)

_helper(
    "broadcast_like",
    '''
def broadcast_like(b, a, axis=-1):
    """Caffe2's legacy broadcast (broadcast=1): b without its leading and trailing 1s matches a's dims
    from `axis` (-1: a's last dims) and repeats over the others."""
    if math.prod(b.shape) == 1:
        return jnp.broadcast_to(jnp.reshape(b, ()), a.shape)
    start, end = 0, b.ndim
    while b.shape[start] == 1:
        start += 1
    while b.shape[end - 1] == 1:
        end -= 1
    first = (a.ndim - b.ndim if axis == -1 else axis) + start
    core = b.shape[start:end]
    return jnp.broadcast_to(jnp.reshape(b, (*core, *(1,) * (a.ndim - first - len(core)))), a.shape)
''',
)

_helper(
    "divide",
    '''
def divide(a, b):
    """Caffe2's Div: integers truncate toward zero (C++ `/`)."""
    return lax.div(a, b) if jnp.issubdtype(a.dtype, jnp.integer) else a / b
''',
)

_helper(
    "softmax",
    '''
def softmax(x, axis=1):
    """Caffe2's Softmax: x viewed as [dims before axis, dims from axis]; each row is normalised."""
    axis = axis % x.ndim
    if x.size == 0:
        return x
    rows = jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    e = jnp.exp(rows - jnp.max(rows, axis=1, keepdims=True))
    return jnp.reshape(e / jnp.sum(e, axis=1, keepdims=True), x.shape)
''',
)

_helper(
    "caffe2_tanh",
    '''
def caffe2_tanh(x):
    """LSTMUnit's tanh, as Caffe2 computes it: 2 * sigmoid(2x) - 1 (clipped where it is +-1 in float32)."""
    return 2 / (1 + jnp.exp(-2 * jnp.clip(x, -20, 20))) - 1
''',
)

_helper(
    "keep_finished",
    '''
def keep_finished(new, prev, seq_lengths, timestep, drop_states=False):
    """Rows whose sequence has ended (timestep >= seq_lengths[n]) keep `prev` (zeros with drop_states)."""
    if seq_lengths is None:
        return new
    valid = (jnp.reshape(timestep, (-1,))[0] < jnp.reshape(seq_lengths, (-1,)))[None, :, None]
    return jnp.where(valid, new, jnp.zeros_like(prev) if drop_states else prev)
''',
)

_helper(
    "lstm_unit",
    '''
def lstm_unit(hidden_prev, cell_prev, gates, seq_lengths, timestep, forget_bias=0.0, drop_states=False):
    """Caffe2's LSTMUnit: gate blocks i, f, o, g of [1, N, 4D] gates; forget_bias is added to f."""
    i, f, o, g = jnp.split(gates, 4, axis=-1)
    i, f, o, g = jax.nn.sigmoid(i), jax.nn.sigmoid(f + forget_bias), jax.nn.sigmoid(o), caffe2_tanh(g)
    cell = f * cell_prev + i * g
    hidden = o * caffe2_tanh(cell)
    return (
        keep_finished(hidden, hidden_prev, seq_lengths, timestep, drop_states),
        keep_finished(cell, cell_prev, seq_lengths, timestep, drop_states),
    )
''',
    "caffe2_tanh",
    "keep_finished",
)

_helper(
    "gru_unit",
    '''
def gru_unit(hidden_prev, gates, seq_lengths, timestep, drop_states=False):
    """Caffe2's GRUUnit: gate blocks r, u, o of [1, N, 3D] gates (r was applied by the step net)."""
    _, u, o = jnp.split(gates, 3, axis=-1)
    u, o = jax.nn.sigmoid(u), 2 * (0.5 + 0.5 * jnp.tanh(o)) - 1
    return keep_finished(u * hidden_prev + (1 - u) * o, hidden_prev, seq_lengths, timestep, drop_states)
''',
    "keep_finished",
)

_helper(
    "concat",
    '''
def concat(xs, axis=1, add_axis=False):
    """Caffe2's Concat: (the concatenation, the sizes along the axis as int32 split_info)."""
    axis = axis % (xs[0].ndim + add_axis)
    if add_axis:
        return jnp.stack(xs, axis=axis), np.ones(len(xs), np.int32)
    return jnp.concatenate(xs, axis=axis), np.array([x.shape[axis] for x in xs], np.int32)
''',
)

_helper(
    "split",
    '''
def split(x, sizes, axis=1):
    """Caffe2's Split by sizes along `axis`."""
    return tuple(jnp.split(x, np.cumsum(np.asarray(sizes))[:-1].tolist(), axis=axis % x.ndim))
''',
)

_helper(
    "reshape",
    '''
def reshape(x, shape):
    """Caffe2's Reshape: a 0 copies the input's dim (input not empty), one -1 takes what is left;
    returns the old shape too."""
    total = math.prod(x.shape)
    dims = [x.shape[i] if d == 0 and total else int(d) for i, d in enumerate(shape)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = total // known if known else 0
    return jnp.reshape(x, dims), np.asarray(x.shape, np.int64)
''',
)

_helper(
    "batch_matmul",
    '''
def batch_matmul(a, b, trans_a=False, trans_b=False):
    """Caffe2's BatchMatMul: matmul over the last two dims (transposed when asked)."""
    if a.ndim == 1 and b.ndim == 1:
        return jnp.reshape(jnp.matmul(a, b, precision=HIGHEST), (1,))
    if trans_a and a.ndim > 1:
        a = jnp.swapaxes(a, -1, -2)
    if trans_b and b.ndim > 1:
        b = jnp.swapaxes(b, -1, -2)
    return jnp.matmul(a, b, precision=HIGHEST)
''',
)

_helper(
    "elementwise_linear",
    '''
def elementwise_linear(x, a, b, axis=1):
    """Caffe2's ElementwiseLinear: x viewed as [N, D] at `axis`; y = x * a + b per column."""
    axis = axis % x.ndim
    rows = jnp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return jnp.reshape(rows * a + b, x.shape)
''',
)

_helper(
    "layer_norm",
    '''
def layer_norm(x, gamma=None, beta=None, axis=1, epsilon=1e-5):
    """Caffe2's LayerNorm: each row of x viewed at `axis` normalised; (y, mean, std)."""
    axis = axis % x.ndim
    n = math.prod(x.shape[axis:])
    rows = jnp.reshape(x, (math.prod(x.shape[:axis]), n))
    if n == 0:
        mean = jnp.zeros((rows.shape[0], 1), x.dtype)
        var_eps = jnp.full((rows.shape[0], 1), epsilon, x.dtype)
    else:
        mean = jnp.mean(rows, axis=1, keepdims=True)
        var_eps = jnp.mean(jnp.square(rows - mean), axis=1, keepdims=True) + jnp.asarray(epsilon, x.dtype)
    y = (rows - mean) * lax.rsqrt(var_eps)
    if gamma is not None:
        y = y * jnp.reshape(gamma, (n,)) + jnp.reshape(beta, (n,))
    stat = (*x.shape[:axis], 1)
    return jnp.reshape(y, x.shape), jnp.reshape(mean, stat), jnp.reshape(jnp.sqrt(var_eps), stat)
''',
)

_helper(
    "sequence_mask",
    '''
def sequence_mask(x, lengths, axis=1, fill=-jnp.inf):
    """Caffe2's SequenceMask, mode 'sequence': x viewed as [rows, cols] at `axis`; element (i, j) becomes
    `fill` where j >= lengths[i]."""
    axis = axis % x.ndim
    if x.size == 0:
        return jnp.asarray(x)
    rows, cols = math.prod(x.shape[:axis]), math.prod(x.shape[axis:])
    column = jnp.reshape(jnp.reshape(lengths, (-1,))[:rows], (rows, 1))
    masked = lax.broadcasted_iota(jnp.int32, (rows, cols), 1) >= column
    return jnp.reshape(jnp.where(masked, jnp.asarray(fill, x.dtype), jnp.reshape(x, (rows, cols))), x.shape)
''',
)

_helper(
    "shape_of",
    '''
def shape_of(x, axes=()):
    """Caffe2's Shape: the dims (or those at `axes`) as a NumPy array, known while tracing."""
    dims = [x.shape[a] for a in axes] if axes else list(x.shape)
    return np.asarray(dims, np.int64)
''',
)

_helper(
    "slice_dims",
    '''
def slice_dims(x, starts, ends):
    """Caffe2's Slice: a negative index i means dim + 1 + i; indices clamp to the dim; dims after
    len(starts) are kept whole."""
    bounds = []
    for i, dim in enumerate(x.shape):
        if i >= len(starts) or dim == 0:
            bounds.append(slice(0, dim))
            continue
        start, end = (int(v) + dim + 1 if v < 0 else int(v) for v in (starts[i], ends[i]))
        bounds.append(slice(min(start, dim), min(end, dim)))
    return x[tuple(bounds)]
''',
)

_helper(
    "initial_row",
    '''
def initial_row(value, batch):
    """A recurrent state's initial value as its first row [1, N, D]: [D] is repeated over the batch,
    [N, D] and [1, N, D] are one row."""
    if value.ndim == 1:
        return jnp.broadcast_to(value, (1, batch, value.shape[0]))
    if value.ndim == 2:
        return value[None]
    if value.shape[0] != 1:
        raise ValueError(f"initial state of shape {value.shape}: this module takes one initial row")
    return value
''',
)


def with_dependencies(names: set[str]) -> list[str]:
    """The helpers `names` and those they call, in the order HELPERS lists them."""
    todo, found = list(names), set()
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            todo.extend(HELPERS[name][1])
    return [name for name in HELPERS if name in found]
