"""Lightning run for tests/ddp/test_lightning.py: the datamodule builds its
WireheadIterableDataset in __init__, before ddp_spawn starts the ranks and
before any process group exists. Each rank writes the (generation, position,
is_pad) items its training steps saw, per epoch.

usage: lightning_proc.py CFG_JSON OUT_DIR EPOCHS"""
import json
import os
import sys

import lightning as L
import torch

import wirehead_torch as wt


class Data(L.LightningDataModule):
    def __init__(self, cfg):
        super().__init__()
        self.ds = wt.WireheadIterableDataset(config=cfg, batch_size=2, num_workers=2,
                                             shuffle=True)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.ds, batch_size=2, num_workers=2,
                                           persistent_workers=True)


class Model(L.LightningModule):
    def __init__(self, out_dir):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.out_dir = out_dir
        self.seen = {}

    def training_step(self, batch, i):
        items = [[int(g), int(p), bool(x)] for g, p, x in
                 zip(batch["generation"], batch["position"], batch["is_pad"])]
        self.seen.setdefault(str(self.current_epoch), []).append(items)
        return (self.w - batch["data"].float().mean()) ** 2

    def on_train_end(self):
        with open(os.path.join(self.out_dir, f"rank{self.global_rank}.json"), "w") as f:
            json.dump({"world": self.trainer.world_size, "epochs": self.seen}, f)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main():
    cfg, out_dir, epochs = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=epochs,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Model(out_dir), datamodule=Data(cfg))


if __name__ == "__main__":
    main()
