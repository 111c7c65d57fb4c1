package auth

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// ZoneAuth checks the credentials a zone opens its KDS stream with: a zone token in the
// `authorization: Bearer TOKEN` metadata, or else, with Certs, a client certificate the TLS
// handshake verified, whose first DNS SAN is the zone's name.
type ZoneAuth struct {
	Keys  *Keys
	Certs bool
	// Now is the clock tokens expire by; nil is time.Now.
	Now func() time.Time
}

// mintHint is how to get a zone token, for the messages that refuse one.
const mintHint = "mint one on the global with `kds-host token zone --name ZONE` and give it to the zone with --zone-token-file"

// BearerToken returns the token of ctx's `authorization: Bearer TOKEN` gRPC metadata, "" when
// there is none, or an Unauthenticated status when the metadata is not of that form.
func BearerToken(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", nil
	}
	tok, ok := strings.CutPrefix(vals[0], "Bearer ")
	if tok = strings.TrimSpace(tok); !ok || tok == "" {
		return "", status.Error(codes.Unauthenticated, "the authorization metadata must be `Bearer TOKEN`")
	}
	return tok, nil
}

// Authenticate returns the zone that ctx's credentials prove, or an Unauthenticated or
// PermissionDenied status that says what is wrong.
func (a ZoneAuth) Authenticate(ctx context.Context) (string, error) {
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	tok, err := BearerToken(ctx)
	if err != nil {
		return "", err
	}
	if tok != "" {
		c, err := a.Keys.Verify(tok, now())
		switch {
		case errors.Is(err, ErrExpired):
			return "", status.Errorf(codes.Unauthenticated, "zone token refused: %v; %s", err, mintHint)
		case err != nil:
			return "", status.Errorf(codes.Unauthenticated, "zone token refused: %v", err)
		case c.Kind != KindZone:
			return "", status.Errorf(codes.PermissionDenied, "a %s token (%q) is not a zone token; %s", c.Kind, c.Name, mintHint)
		}
		return c.Name, nil
	}
	if a.Certs {
		if p, ok := peer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
				leaf := ti.State.VerifiedChains[0][0]
				if len(leaf.DNSNames) == 0 {
					return "", status.Error(codes.PermissionDenied, "the client certificate names no zone: its first DNS SAN must be the zone's name")
				}
				if err := ValidName(leaf.DNSNames[0]); err != nil {
					return "", status.Errorf(codes.PermissionDenied, "the client certificate's zone: %v", err)
				}
				return leaf.DNSNames[0], nil
			}
		}
	}
	return "", status.Errorf(codes.Unauthenticated, "this global requires a zone token: %s", mintHint)
}
