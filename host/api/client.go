package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/kds-host/kds-host/host/resource"
)

// Client talks to a Server. An answer that is not 2xx is returned as an *Error with its Status;
// a request that never got an answer returns the *url.Error of net/http.
type Client struct {
	// BaseURL is the API's address, e.g. http://127.0.0.1:5681.
	BaseURL string
	// HTTPClient is used for every request; nil uses http.DefaultClient.
	HTTPClient *http.Client
	// Token, when set, is sent as `Authorization: Bearer TOKEN`.
	Token string
}

// Path is the route of a resource: name empty for a collection, mesh empty for a global kind's
// resources (or, for a mesh-scoped kind's collection, every mesh).
func Path(k resource.Kind, mesh, name string) string {
	p := "/" + url.PathEscape(k.Plural)
	if k.Scope == resource.ScopeMesh && mesh != "" {
		p = "/meshes/" + url.PathEscape(mesh) + p
	}
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

// Kinds returns the kinds the server serves, as a registry (for Lookup by name or plural).
func (c *Client) Kinds(ctx context.Context) (*resource.Registry, error) {
	var ks Kinds
	if _, err := c.do(ctx, http.MethodGet, "/_resources", nil, &ks); err != nil {
		return nil, err
	}
	reg := &resource.Registry{}
	for _, k := range ks.Resources {
		scope := resource.ScopeGlobal
		if k.Scope == "Mesh" {
			scope = resource.ScopeMesh
		}
		if err := reg.Register(resource.Kind{Name: k.Name, Plural: k.Path, Scope: scope}); err != nil {
			return nil, fmt.Errorf("kinds of %s: %w", c.BaseURL, err)
		}
	}
	return reg, nil
}

// Index returns what GET / says about the server.
func (c *Client) Index(ctx context.Context) (Index, error) {
	var i Index
	_, err := c.do(ctx, http.MethodGet, "/", nil, &i)
	return i, err
}

// Get returns one resource.
func (c *Client) Get(ctx context.Context, k resource.Kind, mesh, name string) (resource.Resource, error) {
	var r resource.Resource
	_, err := c.do(ctx, http.MethodGet, Path(k, mesh, name), nil, &r)
	return r, err
}

// List returns the resources of a kind: in one mesh, or in every mesh when mesh is empty.
func (c *Client) List(ctx context.Context, k resource.Kind, mesh string) (List, error) {
	var l List
	_, err := c.do(ctx, http.MethodGet, Path(k, mesh, ""), nil, &l)
	return l, err
}

// Put sends a resource document (JSON) to its route and says what the server did with it.
func (c *Client) Put(ctx context.Context, k resource.Kind, mesh, name string, doc []byte) (resource.Resource, Outcome, error) {
	var r resource.Resource
	h, err := c.do(ctx, http.MethodPut, Path(k, mesh, name), doc, &r)
	if err != nil {
		return resource.Resource{}, "", err
	}
	return r, Outcome(h.Get(ResultHeader)), nil
}

// Delete removes one resource.
func (c *Client) Delete(ctx context.Context, k resource.Kind, mesh, name string) error {
	_, err := c.do(ctx, http.MethodDelete, Path(k, mesh, name), nil, nil)
	return err
}

func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := c.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: read the answer: %w", method, req.URL, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		e := &Error{}
		if json.Unmarshal(b, e) != nil || (e.Title == "" && e.Details == "") {
			e = &Error{Title: http.StatusText(resp.StatusCode), Details: strings.TrimSpace(string(b))}
		}
		e.Status = resp.StatusCode
		return resp.Header, e
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return nil, fmt.Errorf("%s %s: decode the answer: %w", method, req.URL, err)
		}
	}
	return resp.Header, nil
}

// PostJSON POSTs in as JSON to path and decodes the JSON answer into out. A refusal comes back as
// an *Error.
func (c *Client) PostJSON(ctx context.Context, path string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	_, err = c.do(ctx, http.MethodPost, path, body, out)
	return err
}

// GetJSON GETs path (e.g. "/api/zones") and decodes the JSON answer into out.
func (c *Client) GetJSON(ctx context.Context, path string, out any) error {
	_, err := c.do(ctx, http.MethodGet, path, nil, out)
	return err
}
