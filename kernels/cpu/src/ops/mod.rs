//! Reference ops on f32 rows: norms, rope, softmax, attention, routing, activations.
