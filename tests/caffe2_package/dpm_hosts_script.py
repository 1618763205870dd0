"""Train an MLP with data_parallel_model across shards, as Caffe2's resnet50_trainer.py does (real Caffe2 and
rnn2jax run it; every shard runs this same file).

Usage: dpm_hosts_script.py OUT --shard_id I --num_shards N --file_store_path DIR [--build_only]
       dpm_hosts_script.py OUT --reference

Each shard trains on 2 CPU devices; step s gives the (shard, device) copy k the rows k*B .. (k+1)*B of that
step's global batch. Shard i starts from its own random parameters (shard 0's must win: the init net's
Broadcast). `--reference` trains one plain model (no data_parallel_model) in one process on the whole global
batch from shard 0's start. `--build_only` stops after Parallelize. OUT.npz gets the parameters (and the
start, each step's global batch, the learning rate), OUT.net / OUT.init the nets built.
"""

import argparse

import numpy as np
from caffe2.python import brew, core, data_parallel_model, dyndep, model_helper, optimizer, workspace

dyndep.InitOpsLibrary("@/caffe2/caffe2/distributed:file_store_handler_ops")

D, H, C, B, STEPS, LR = 6, 5, 3, 4, 3, 0.5
DEVICES = [0, 1]
SHARDS = 2  # the global batch is SHARDS x len(DEVICES) x B rows, whatever this process is asked to do
PARAMS = ("fc1_w", "fc1_b", "fc2_w", "fc2_b")

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--shard_id", type=int, default=0)
parser.add_argument("--num_shards", type=int, default=1)
parser.add_argument("--file_store_path", default=None)
parser.add_argument("--interface", default="lo")
parser.add_argument("--build_only", action="store_true")
parser.add_argument("--reference", action="store_true")
args = parser.parse_args()


def start(shard):
    rng = np.random.RandomState(100 + shard)
    return {
        "fc1_w": rng.randn(H, D).astype(np.float32) * 0.5,
        "fc1_b": rng.randn(H).astype(np.float32) * 0.1,
        "fc2_w": rng.randn(C, H).astype(np.float32) * 0.5,
        "fc2_b": rng.randn(C).astype(np.float32) * 0.1,
    }


def batch(step):
    rng = np.random.RandomState(1000 + step)
    rows = SHARDS * len(DEVICES) * B
    return rng.randn(rows, D).astype(np.float32), rng.randint(C, size=rows).astype(np.int32)


initial = start(0 if args.reference else args.shard_id)


def forward(model, loss_scale):
    def given(name):
        return ("GivenTensorFill", {"values": initial[name]})

    hidden = brew.fc(model, "data", "fc1", D, H, weight_init=given("fc1_w"), bias_init=given("fc1_b"))
    hidden = brew.relu(model, hidden, "relu1")
    logits = brew.fc(model, hidden, "fc2", H, C, weight_init=given("fc2_w"), bias_init=given("fc2_b"))
    softmax = model.net.Softmax(logits, "softmax")
    loss = model.net.AveragedLoss(model.net.LabelCrossEntropy([softmax, "label"], "xent"), "loss")
    return [model.net.Scale(loss, "loss_scaled", scale=loss_scale)]


def build_optimizer(model):
    return optimizer.build_sgd(model, base_learning_rate=LR, policy="fixed")


results = {"start:" + name: value for name, value in initial.items()}
results["lr"] = np.float64(LR)
for step in range(STEPS):
    results[f"data:{step}"], results[f"label:{step}"] = batch(step)
if args.reference:
    model = model_helper.ModelHelper(name="dpm_reference")
    model.AddGradientOperators(forward(model, 1.0))
    build_optimizer(model)
    workspace.RunNetOnce(model.param_init_net)
    for step in range(STEPS):
        data, label = batch(step)
        workspace.FeedBlob("data", data)
        workspace.FeedBlob("label", label)
        if step == 0:
            workspace.CreateNet(model.net)
        workspace.RunNet(model.net.Proto().name)
    results.update({name: workspace.FetchBlob(name) for name in PARAMS})
    np.savez(args.out + ".npz", **results)
    raise SystemExit(0)

rendezvous = None
if args.num_shards > 1:
    workspace.RunOperatorOnce(
        core.CreateOperator(
            "FileStoreHandlerCreate", [], ["store_handler"], path=args.file_store_path, prefix="dpm_hosts"
        )
    )
    rendezvous = dict(
        kv_handler="store_handler",
        shard_id=args.shard_id,
        num_shards=args.num_shards,
        engine="GLOO",
        interface=args.interface,
        exit_nets=None,
    )

model = model_helper.ModelHelper(name="dpm_hosts")
data_parallel_model.Parallelize_CPU(
    model,
    input_builder_fun=lambda model: None,  # the rows are fed per device: cpu_<d>/data, cpu_<d>/label
    forward_pass_builder_fun=forward,
    optimizer_builder_fun=build_optimizer,
    devices=DEVICES,
    rendezvous=rendezvous,
)
with open(args.out + ".net", "wb") as f:
    f.write(model.net.Proto().SerializeToString())
with open(args.out + ".init", "wb") as f:
    f.write(model.param_init_net.Proto().SerializeToString())
if args.build_only:
    raise SystemExit(0)

for step in range(STEPS):
    data, label = batch(step)
    for index, device in enumerate(DEVICES):
        copy = (args.shard_id * len(DEVICES) + index) * B
        workspace.FeedBlob(f"cpu_{device}/data", data[copy : copy + B])
        workspace.FeedBlob(f"cpu_{device}/label", label[copy : copy + B])
    if step == 0:
        data_parallel_model.RunInitNet(model)  # creates the nets: their inputs must exist by then
    data_parallel_model.RunNet(model, 1)
data_parallel_model.Synchronize(model)  # deprecated in Caffe2, still called by scripts: a barrier net
data_parallel_model.FinalizeAfterCheckpoint(model, cpu_mode=True)  # shard 0's first copy to every copy
for device in DEVICES:
    for name in PARAMS:
        results[f"cpu_{device}/{name}"] = workspace.FetchBlob(f"cpu_{device}/{name}")
np.savez(args.out + ".npz", **results)
