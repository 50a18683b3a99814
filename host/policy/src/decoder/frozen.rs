//! Passes that reuse what the frozen lower layers computed: their residual stream is kept, and
//! only the layers that train run again over it.

use std::ops::Range;

use tch::{Kind, Tensor};

use super::{AttentionMask, FusedWeights, KvCache, Transformer};

impl Transformer {
    /// [`Transformer::forward_with`] that also returns the residual stream entering layer
    /// `boundary` for the new tokens: what [`Transformer::refill_upper`] recomputes the upper
    /// layers' keys and values from after an update that changed only those layers.
    pub fn forward_keeping(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &AttentionMask,
        cache: &mut KvCache,
        boundary: usize,
        fused: Option<&FusedWeights>,
    ) -> (Tensor, Tensor) {
        let (layers, boundary) = (self.layers.len(), boundary.min(self.layers.len()));
        let past = cache.len;
        let lower = self.cached_layers(self.embed(input_ids), positions, mask, Some(&mut *cache), fused, 0..boundary);
        // The upper layers append at the same columns.
        cache.len = past;
        let upper = self.cached_layers(lower.shallow_clone(), positions, mask, Some(cache), fused, boundary..layers);
        (self.norm.forward(&upper), lower)
    }

    /// Writes the keys and values of layers `from..` for the first `hidden.size(1)` columns of a
    /// one-row `cache`, from `hidden` (`[1, columns, hidden]`), the residual stream entering layer
    /// `from` at positions `0..columns` ([`Transformer::forward_keeping`]). The lower layers'
    /// columns are left as they are: rows kept from before an update that trained only the
    /// layers from `from` up stay exact.
    pub fn refill_upper(&self, hidden: &Tensor, cache: &mut KvCache, from: usize, fused: Option<&FusedWeights>) {
        let columns = hidden.size()[1];
        let positions = Tensor::arange(columns, (Kind::Int64, self.device())).unsqueeze(0);
        let filled = cache.len;
        cache.len = 0;
        let from = from.min(self.layers.len());
        let _ = self.cached_layers(
            hidden.shallow_clone(),
            &positions,
            &AttentionMask::Causal,
            Some(&mut *cache),
            fused,
            from..self.layers.len(),
        );
        cache.len = filled.max(columns);
    }

    /// The residual stream after the lowest `layers` decoder layers of a causal pass without a
    /// cache, computed without gradients: where [`Transformer::forward_from`] continues. Meant
    /// for layers that [`Transformer::frozen_layers`] counts, whose output no update changes.
    pub fn lower_hidden(&self, input_ids: &Tensor, positions: &Tensor, layers: usize) -> Tensor {
        tch::no_grad(|| self.causal_layers(self.embed(input_ids), positions, 0..layers.min(self.layers.len())))
    }

    /// [`Transformer::forward`] of a causal pass without a cache, continued from `hidden`, the
    /// residual stream after the lowest `from` layers ([`Transformer::lower_hidden`]).
    pub fn forward_from(&self, hidden: &Tensor, positions: &Tensor, from: usize) -> Tensor {
        let from = from.min(self.layers.len());
        self.norm.forward(&self.causal_layers(hidden.shallow_clone(), positions, from..self.layers.len()))
    }

    /// Decoder layers `layers` of a causal pass without a cache over the residual stream
    /// `hidden` (no final norm): for passes that recompute one layer at a time.
    pub fn run_layers(&self, hidden: &Tensor, positions: &Tensor, layers: Range<usize>) -> Tensor {
        let layers = layers.start.min(self.layers.len())..layers.end.min(self.layers.len());
        self.causal_layers(hidden.shallow_clone(), positions, layers)
    }

    fn causal_layers(&self, mut x: Tensor, positions: &Tensor, layers: Range<usize>) -> Tensor {
        let rope = self.rotary(positions);
        let pass = self.pass();
        for block in &self.layers[layers] {
            x = block.forward(&x, &rope, &AttentionMask::Causal, None, pass, None);
        }
        x
    }

    /// How many of the lowest decoder layers are frozen, with the embeddings below them: no
    /// weight of theirs takes gradients and none carries an adapter, so their output for given
    /// tokens stays the same while the rest trains. 0 when the embeddings train.
    pub fn frozen_layers(&self) -> usize {
        if self.embed_tokens.requires_grad() {
            return 0;
        }
        self.layers.iter().take_while(|b| !b.trains()).count()
    }
}
