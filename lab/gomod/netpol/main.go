// gpuk8s-netpol: sigs.k8s.io/kube-network-policies' NetworkPolicy controller (nftables +
// nfqueue) run as a host daemon of the lab node, as its DaemonSet (hostNetwork, privileged)
// runs it on a real node. lab/netpol.sh starts it; lab/tools.sh netpol builds it.
//
//	gpuk8s-netpol --kubeconfig FILE --hostname-override NODE [--nfqueue-id N] [--metrics-bind-address ADDR] [--v N]
//	gpuk8s-netpol --cleanup      delete the controller's nftables table and the steering
//	                             chain (a daemon killed hard leaves them) and exit;
//	                             lab/netpol.sh stop runs it
//
// Why a wrapper and not the module's cmd: that one only reads the in-cluster service-account
// files (a host daemon has none) and stops on SIGINT only, so SIGTERM (how lab/down and
// lab/ctl stop a daemon) would leave its nftables table behind, queueing packets to nobody.
// Here SIGTERM too ends the controller, which deletes its table before it exits. And the
// first packets reach the controller's queue through iptables (steer.go), since the
// upstream nftables rules need a kernel with nft_queue, which this lab's machines lack.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/google/nftables"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

// tableName is the controller's nftables table (networkpolicy.Config's default NFTableName).
const tableName = "kube-network-policies"

func main() {
	os.Exit(run())
}

// cleanup deletes tableName if present: a table left without its controller queues the
// first packet of every connection of a policy's pods to nobody, so they are dropped.
func cleanup() int {
	nft, err := nftables.New()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuk8s-netpol --cleanup: nftables: %v\n", err)
		return 1
	}
	tables, err := nft.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuk8s-netpol --cleanup: listing tables: %v\n", err)
		return 1
	}
	removeChain()
	for _, t := range tables {
		if t.Name == tableName {
			nft.DelTable(t)
			if err := nft.Flush(); err != nil {
				fmt.Fprintf(os.Stderr, "gpuk8s-netpol --cleanup: deleting table inet %s: %v\n", tableName, err)
				return 1
			}
			fmt.Printf("deleted nftables table inet %s\n", tableName)
		}
	}
	return 0
}

func run() int {
	var (
		kubeconfig  string
		nodeName    string
		queueID     int
		metricsAddr string
		failOpen    bool
		clean       bool
	)
	klog.InitFlags(nil)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the controller's identity (required)")
	flag.StringVar(&nodeName, "hostname-override", "", "name of the Node whose pods this daemon guards (required)")
	flag.IntVar(&queueID, "nfqueue-id", 100, "number of the nfqueue the first packet of each connection goes to (1-65535)")
	flag.StringVar(&metricsAddr, "metrics-bind-address", "127.0.0.1:9080", "host:port of the Prometheus metrics endpoint")
	flag.BoolVar(&failOpen, "fail-open", false, "let packets through while no controller reads the queue (default: drop them)")
	flag.BoolVar(&clean, "cleanup", false, "delete the controller's nftables table and exit")
	flag.Parse()
	if clean {
		return cleanup()
	}
	if kubeconfig == "" || nodeName == "" {
		fmt.Fprintln(os.Stderr, "gpuk8s-netpol: --kubeconfig and --hostname-override are required")
		return 2
	}
	if queueID < 1 || queueID > 65535 {
		fmt.Fprintf(os.Stderr, "gpuk8s-netpol: --nfqueue-id %d: allowed 1-65535\n", queueID)
		return 2
	}
	if _, _, err := net.SplitHostPort(metricsAddr); err != nil {
		fmt.Fprintf(os.Stderr, "gpuk8s-netpol: --metrics-bind-address %q: want host:port (%v)\n", metricsAddr, err)
		return 2
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuk8s-netpol: --kubeconfig %s: %v\n", kubeconfig, err)
		return 1
	}
	config.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	config.ContentType = "application/vnd.kubernetes.protobuf"
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpuk8s-netpol: client: %v\n", err)
		return 1
	}
	factory := informers.NewSharedInformerFactory(clientset, 0)

	metrics := &http.Server{Addr: metricsAddr, Handler: promhttp.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := metrics.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "metrics endpoint", "address", metricsAddr)
		}
	}()

	controller, err := networkpolicy.NewController(
		clientset,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil, // no (Baseline)AdminNetworkPolicy: plain NetworkPolicy only
		networkpolicy.Config{
			FailOpen:    failOpen,
			QueueID:     queueID,
			NodeName:    nodeName,
			NFTableName: tableName,
			// NRI on, as upstream's default: with it off, v0.8.0 dereferences its nil NRI
			// plugin for a packet whose address no pod holds (a host process's, a deleted
			// pod's) and crashes. Where containerd serves no NRI the plugin only logs that
			// it could not connect, and pod addresses come from the API server.
			NRIdisabled: false,
		},
	)
	if err != nil {
		klog.ErrorS(err, "cannot start the network policy controller")
		return 1
	}
	steer, err := newSteerer(factory, nodeName, queueID, failOpen)
	if err != nil {
		klog.ErrorS(err, "cannot watch pods and NetworkPolicies for the steering rules")
		return 1
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := controller.Run(ctx); err != nil {
			klog.ErrorS(err, "network policy controller stopped")
		}
	}()
	steered := make(chan struct{})
	go func() {
		defer close(steered)
		steer.run(ctx)
	}()
	factory.Start(ctx.Done())
	klog.InfoS("gpuk8s-netpol running", "node", nodeName, "nfqueue", queueID, "metrics", metricsAddr)

	select {
	case <-ctx.Done():
	case <-done: // the controller ended on its own (its nfqueue failed)
		cancel()
		<-steered
		return 1
	}
	// Run's deferred cleanup deletes the nftables table, the steerer its chain; both are
	// quick (lab/lib.sh's stop_daemon waits 10 s before SIGKILL).
	for _, stopped := range []chan struct{}{done, steered} {
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			klog.InfoS("a part did not stop within 5s")
		}
	}
	shutdown, stop := context.WithTimeout(context.Background(), 2*time.Second)
	defer stop()
	_ = metrics.Shutdown(shutdown)
	return 0
}
