// Command gpushare-scheduler-extender stands in, on the loopback node, for the part
// of HAMi's scheduler extender that its device plugin depends on: the annotations
// its Filter and Bind write on a pod (Project-HAMi/HAMi @ 4707fb02c91c,
// pkg/scheduler/scheduler.go:1067-1145 Filter, 998-1065 Bind). The kube-scheduler
// it extends is the real one (profile hami-scheduler); HAMi's accounting across
// nodes, quotas and node locks are not modelled: cards are picked least used first
// from what this process has handed out.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

type extender struct {
	client   kubernetes.Interface
	gpus     int
	memory   int64
	resource string
	mu       sync.Mutex
	used     map[int]int64 // card -> MiB handed out
}

func uuidOf(i int) string { return fmt.Sprintf("GPU-00000000-0000-0000-0000-00000000000%d", i) }

func quantity(ctr *corev1.Container, name string) (int64, bool) {
	q, ok := ctr.Resources.Limits[corev1.ResourceName(name)]
	if !ok {
		q, ok = ctr.Resources.Requests[corev1.ResourceName(name)]
	}
	if !ok {
		return 0, false
	}
	return q.Value(), true
}

// devicesFor is one container's entry of hami.io/vgpu-devices-to-allocate: for each
// of its nvidia.com/gpu, a card with gpumem MiB (or gpumem-percentage of the card,
// else the whole card) and gpucores (HAMi pkg/device/nvidia/device.go:520-590,
// GenerateResourceRequests; defaultMemory and defaultCores 0 as in the chart).
func (e *extender) devicesFor(ctr *corev1.Container) string {
	n, ok := quantity(ctr, e.resource)
	if !ok || n <= 0 {
		return ""
	}
	mem, ok := quantity(ctr, "nvidia.com/gpumem")
	if !ok || mem <= 0 {
		mem = e.memory
		if pct, ok := quantity(ctr, "nvidia.com/gpumem-percentage"); ok && pct > 0 && pct <= 100 {
			mem = e.memory * pct / 100
		}
	}
	cores, _ := quantity(ctr, "nvidia.com/gpucores")
	var out strings.Builder
	taken := map[int]bool{}
	for i := int64(0); i < n; i++ {
		best := -1
		for card := 0; card < e.gpus; card++ {
			if !taken[card] && (best < 0 || e.used[card] < e.used[best]) {
				best = card
			}
		}
		if best < 0 {
			break
		}
		taken[best] = true
		e.used[best] += mem
		// pkg/device/devices.go:451-458 (EncodeContainerDevices).
		fmt.Fprintf(&out, "%s,%s,%d,%d:", uuidOf(best), "NVIDIA", mem, cores)
	}
	return out.String()
}

func (e *extender) patch(ctx context.Context, namespace, name string, annotations map[string]string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	if err != nil {
		return err
	}
	_, err = e.client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}

// filter passes every node and, for the node it would pick (the first), writes the
// allocation annotations as HAMi's Filter does (scheduler.go:1124-1139:
// vgpu-node, vgpu-time, and PatchAnnotations: devices-to-allocate and
// devices-allocated, init containers first, pkg/device/nvidia/device.go:500-511).
func (e *extender) filter(args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	if args.NodeNames == nil || len(*args.NodeNames) == 0 {
		return &extenderv1.ExtenderFilterResult{Error: "no nodes"}
	}
	node := (*args.NodeNames)[0]
	pod := args.Pod
	e.mu.Lock()
	var value strings.Builder
	for i := range pod.Spec.InitContainers {
		value.WriteString(e.devicesFor(&pod.Spec.InitContainers[i]) + ";")
	}
	for i := range pod.Spec.Containers {
		value.WriteString(e.devicesFor(&pod.Spec.Containers[i]) + ";")
	}
	e.mu.Unlock()
	annotations := map[string]string{
		"hami.io/vgpu-node":                node,
		"hami.io/vgpu-time":                strconv.FormatInt(time.Now().Unix(), 10),
		"hami.io/vgpu-devices-to-allocate": value.String(),
		"hami.io/vgpu-devices-allocated":   value.String(),
	}
	if err := e.patch(context.Background(), pod.Namespace, pod.Name, annotations); err != nil {
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	return &extenderv1.ExtenderFilterResult{NodeNames: &[]string{node}}
}

// bind is scheduler.go:998-1065 less the node lock: bind-phase allocating and
// bind-time, then the Binding.
func (e *extender) bind(args *extenderv1.ExtenderBindingArgs) *extenderv1.ExtenderBindingResult {
	ctx := context.Background()
	err := e.patch(ctx, args.PodNamespace, args.PodName, map[string]string{
		"hami.io/bind-phase": "allocating",
		"hami.io/bind-time":  strconv.FormatInt(time.Now().Unix(), 10),
	})
	if err == nil {
		err = e.client.CoreV1().Pods(args.PodNamespace).Bind(ctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: args.PodName, UID: args.PodUID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
		}, metav1.CreateOptions{})
	}
	if err != nil {
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}
	}
	return &extenderv1.ExtenderBindingResult{}
}

func serve[In any, Out any](handle func(*In) *Out) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var in In
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(handle(&in))
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on (loopback)")
	portFile := flag.String("port-file", "", "write the port served on here")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig")
	gpus := flag.Int("gpus", 4, "fake cards on the node")
	memory := flag.Int64("memory", 16384, "MiB per card")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatal(err)
	}
	e := &extender{client: kubernetes.NewForConfigOrDie(config), gpus: *gpus, memory: *memory,
		resource: "nvidia.com/gpu", used: map[int]int64{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/filter", serve(e.filter))
	mux.HandleFunc("/bind", serve(e.bind))
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	if *portFile != "" {
		port := listener.Addr().(*net.TCPAddr).Port
		if err := os.WriteFile(*portFile, []byte(strconv.Itoa(port)), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatal(http.Serve(listener, mux))
}
