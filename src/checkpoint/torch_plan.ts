/**
 * The plan of a PyTorch export from a model's TF.js topology: its layers, checked, each mapped
 * onto torch modules and parameters (torch_layers.ts) in order.
 */
import { topologyLayers, type LayerJson } from './checkpoint_format.ts';
import { TorchExportError, checkName } from './torch_export_errors.ts';
import { PlanBuilder, type Plan } from './torch_plan_builder.ts';
import { LAYER_MAPPERS } from './torch_layers.ts';

/** The model's layers, each layer's name checked against TF.js's pattern before anything uses it. */
function layersOf(topology: unknown, file: string | undefined): LayerJson[] {
  const { className, layers } = topologyLayers(topology);
  if (className === undefined)
    throw new TorchExportError(undefined, 'the model has no topology (a TF.js Layers model is needed, as model.save() writes it)');
  layers.forEach((layer: unknown, i) => {
    const config = typeof layer === 'object' && layer !== null ? (layer as { config?: unknown }).config : undefined;
    if (typeof config !== 'object' || config === null) throw new TorchExportError(undefined, `layer ${i} of the topology has no config`);
    checkName('layer', (config as { name?: unknown }).name, file);
  });
  if (className === 'Sequential') return layers;
  if (className === 'Model' || className === 'Functional') {
    // A functional model is exported when it is a chain: each layer fed by the one before it.
    layers.forEach((layer, i) => {
      if (i === 0) return;
      const nodes = (layer as unknown as { inbound_nodes?: unknown[][] }).inbound_nodes ?? [];
      const from = nodes.length === 1 && nodes[0]!.length === 1 ? (nodes[0]![0] as unknown[])[0] : undefined;
      const previous = String(layers[i - 1]!.config.name);
      if (from !== previous)
        throw new TorchExportError(
          String(layer.config.name),
          `it is not fed by the layer before it ("${previous}") alone: only a chain of layers (a Sequential) is exported`,
        );
    });
    return layers;
  }
  throw new TorchExportError(undefined, `the model is a ${className}; a Sequential or a chain of layers is exported`);
}

export function makePlan(topology: unknown, file: string | undefined): Plan {
  const layers = layersOf(topology, file);
  if (layers.length === 0) throw new TorchExportError(undefined, 'the model has no layers');
  const first = layers[0]!.config;
  const batchShape = (first.batch_input_shape ?? first.batchInputShape) as Array<number | null> | undefined;
  if (
    !Array.isArray(batchShape) ||
    batchShape.length < 2 ||
    !batchShape.slice(1).every((d) => Number.isSafeInteger(d) && (d as number) >= 1)
  ) {
    throw new TorchExportError(
      String(first.name),
      'the first layer has no fixed input shape (batch_input_shape [null, ...]); build the model with inputShape',
    );
  }
  const tfInputShape = batchShape.slice(1) as number[];
  const b = new PlanBuilder(tfInputShape);
  for (const [index, { class_name: kind, config: c }] of layers.entries()) {
    const name = c.name as string; // checked in layersOf
    // A Flatten of an image may pass element-wise layers on its way to its Dense; nothing else.
    if (b.flow.flattened && !['Dense', 'Dropout', 'Activation', 'ReLU', 'LeakyReLU', 'ELU'].includes(kind)) {
      throw new TorchExportError(
        name,
        "it follows a Flatten of an image [h, w, c] before any Dense layer; only a Dense (after element-wise layers) can take the reordering to torch's channels-first flatten",
      );
    }
    const map = LAYER_MAPPERS.get(kind);
    if (!map)
      throw new TorchExportError(
        name,
        `${kind} layers have no mapping to torch here (exported: Dense, Conv2D, MaxPooling2D, AveragePooling2D, GlobalAveragePooling2D, GlobalMaxPooling2D, Flatten, Dropout, Activation, ReLU, LeakyReLU, ELU, Softmax, BatchNormalization, LayerNormalization, Embedding, and the language model's TokenAndPositionEmbedding and TransformerBlock)`,
      );
    map(b, c, name, { kind, index, layers });
  }
  if (b.flow.flattened)
    throw new TorchExportError(
      undefined,
      'the model ends with a Flatten of an image: its output order would differ between TF.js (H, W, C) and torch (C, H, W)',
    );
  return b.plan;
}
