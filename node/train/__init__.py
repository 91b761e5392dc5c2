"""Deterministic training and trace recording (issue 3).

Import from the submodules (torch loads with them)::

    from node.spec import load_spec, parse_spec, JobSpec
    from node.datasets import load_dataset, pack_digits, pack_text, write_dataset
    from node.train.step import (TrainContext, TrainState, init_state, train_step,
                                 state_tensors, load_state, batch, batch_indices,
                                 step_generator, lr_at, derive_seed)
    from node.train.behavior import (SegmentBehavior, HonestBehavior,
                                     register_behavior, get_behavior)
    from node.train.trace import (run_training, load_checkpoint, read_manifest,
                                  merkle_proof, regenerate, checkpoint_name)

``models`` holds the family registry (MLP, CNN, char transformer LM) and the
per-step dropout randomness; ``step`` the one ``train_step`` every role runs;
``behavior`` how a solver produces each segment (honest, or the verifier's
registered cheats); ``trace`` checkpoints, Merkle root, manifest, resume and
regeneration. Each module's docstring documents its API.
"""
