# Device call B (carry [".gpudata"], right after call A): the Fashion-MNIST data, then bench/fashion.py on one GPU (results to $OUT).
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 BENCH_RESULTS=$OUT
test -d /tmp/site/ray || { echo "no /tmp/site: the machine went back after call A"; exit 3; }
mkdir -p /tmp/fm && tar xJf .gpudata/fm.tar.xz -C /tmp/fm && gzip -1 -f /tmp/fm/*-ubyte && ls -la /tmp/fm
CAMPAIGN_S=${CAMPAIGN_S:-440}
timeout $((CAMPAIGN_S + 100)) python3 bench/fashion.py --campaign-s $CAMPAIGN_S --trial-s 30 --slots 4 --seeds 0 \
  --parallel --stagger-s 10 --knob-samples 4 --name fashion_gpu -- resources=gpu resources.gpu=0.25 resources.cpu=2 \
  sandbox=none data.root=/tmp/fm 2>&1 | tee $OUT/bench.log | grep -v "^\s*trial " | tail -60
for d in /tmp/bench-fashion-*/*/; do tail -c 3000 $d/campaign.log > $OUT/$(basename $d).log; done
