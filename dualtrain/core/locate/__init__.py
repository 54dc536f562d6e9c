"""The locator: where a model pair's two sides first part, and which classic porting mistake it is.
Framework-free: it judges what each backend's child recorded on the same batch in float64
(dualtrain.backends.torch.locate.probe_layers, dualtrain.backends.tf.locate.probe_layers).

For each weighted layer, in the order the torch forward runs them, three relative differences:

* ``input``: the Keras layer's input in the Keras forward against the torch module's input: a
  difference here that the previous layer's output did not have was made *between* the two
  (activations, flatten, add: the parameter-free operations);
* ``own``: the Keras layer's output when it is fed the torch module's input, against the torch
  module's output: what the layer itself does differently (a difference it *introduces*, not one
  it inherits);
* ``grad``: the parameters' gradients of the same loss on the same batch.

The first layer with a difference over :data:`TOL` is the finding; then the model's output (a
softmax after the last layer), then the gradients. Each finding is matched against the classic
mistakes where the evidence fits: asymmetric 'same' padding on a strided convolution, flatten
order, a transposed kernel, an activation inside the last dense layer (softmax with a loss on
logits), a different activation (approximate vs exact gelu), Keras's float64 gelu.

Modules:

* ``compare``: the two sides' recordings against each other, one :class:`Row` per weighted layer;
* ``mistakes``: the classic mistakes the evidence fits (and the activations told apart by the probe
  vector);
* ``finding``: :func:`locate`, the first difference and its :class:`Finding`.
"""

from dualtrain.core.locate.finding import Finding, locate

__all__ = ["Finding", "locate"]
