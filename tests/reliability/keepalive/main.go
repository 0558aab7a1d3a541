// Sends admissions through Go's own HTTP client, as the API server does (client-go's
// transports keep Go's defaults: keep-alive connections, idle for at most IdleConnTimeout,
// 90 s), one every --gap-min..--gap-max, and counts the ones that fail. With gaps near the
// webhook's idle deadline the webhook closes connections as requests are sent on them;
// Go does not resend a POST it has written, so those admissions fail. When the client's
// idle timeout is the shorter one, the client closes first and none fail.
//
//	keepalive --url=https://127.0.0.1:8443/mutate-pods --ca=ca.crt --body=review.json \
//	  --gap-min=99ms --gap-max=101ms --requests=1000 [--client-idle=90s]
//
// Prints one JSON object; exits 0 whatever the count (the caller decides what to expect).
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	url := flag.String("url", "", "admission URL")
	caFile := flag.String("ca", "", "CA certificate (PEM) the server's certificate chains to")
	bodyFile := flag.String("body", "", "AdmissionReview to send")
	gapMin := flag.Duration("gap-min", 100*time.Millisecond, "shortest pause between requests")
	gapMax := flag.Duration("gap-max", 100*time.Millisecond, "longest pause between requests")
	requests := flag.Int("requests", 100, "requests to send")
	clientIdle := flag.Duration("client-idle", 90*time.Second, "the client's IdleConnTimeout")
	flag.Parse()
	if *url == "" || *caFile == "" || *bodyFile == "" || *gapMax < *gapMin {
		fmt.Fprintln(os.Stderr, "keepalive: --url, --ca and --body are required; --gap-max >= --gap-min")
		os.Exit(2)
	}
	ca, err := os.ReadFile(*caFile)
	must(err)
	body, err := os.ReadFile(*bodyFile)
	must(err)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		must(fmt.Errorf("--ca=%s: no PEM certificate", *caFile))
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: roots}
	transport.IdleConnTimeout = *clientIdle
	transport.MaxIdleConnsPerHost = 25 // client-go's
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	failed := 0
	reasons := map[string]int{}
	spread := int64(*gapMax - *gapMin)
	for i := 0; i < *requests; i++ {
		gap := *gapMin
		if spread > 0 {
			gap += time.Duration(rand.Int63n(spread + 1))
		}
		time.Sleep(gap)
		resp, err := client.Post(*url, "application/json", bytes.NewReader(body))
		if err == nil {
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(answer), `"allowed":true`) {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil {
			failed++
			reason := err.Error()
			if i := strings.LastIndex(reason, ": "); i >= 0 {
				reason = reason[i+2:] // "EOF", "connection reset by peer": not the address
			}
			reasons[reason]++
		}
	}
	out, _ := json.Marshal(map[string]any{
		"requests": *requests, "failed": failed, "reasons": reasons,
		"gap_min_ms": gapMin.Milliseconds(), "gap_max_ms": gapMax.Milliseconds(),
		"client_idle_ms": clientIdle.Milliseconds(),
	})
	fmt.Println(string(out))
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "keepalive:", err)
		os.Exit(2)
	}
}
