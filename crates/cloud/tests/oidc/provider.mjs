// A real OpenID Connect provider for the cloud's sign-in tests (tests/signin.rs):
// panva's oidc-provider (an OpenID-certified implementation) with its development login
// form (any login, any password), listening on 127.0.0.1 only (on port $PORT, else one the
// system picks; the e2e console test runs it inside the bed's cloud namespace).
//
//   node provider.mjs <redirect-uri> <mode>
//
// It prints its issuer URL on a line of its own once it listens. The person's groups come
// from their login: ada is in net-admins, olivia in net-ops, victor in staff, nora in none.
// Modes:
//   normal        as any provider;
//   forged-keys   ID tokens are signed with a key the provider does not publish (its JWKS
//                 lists another), as a forger's would be;
//   clock-behind  the provider's clock runs two hours behind: its ID tokens have ended
//                 before they arrive.
import http from 'node:http';
import crypto from 'node:crypto';
import Provider from 'oidc-provider';

const [redirect, mode = 'normal'] = process.argv.slice(2);
if (!redirect) {
  console.error('usage: node provider.mjs <redirect-uri> [normal|forged-keys|clock-behind]');
  process.exit(2);
}
if (mode === 'clock-behind') {
  const now = Date.now;
  Date.now = () => now() - 2 * 3600 * 1000;
}
const groups = { ada: ['net-admins'], olivia: ['net-ops'], victor: ['staff'], nora: [] };
const signing = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey
  .export({ format: 'jwk' });
signing.kid = 'signing';
signing.use = 'sig';
signing.alg = 'RS256';
const published = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 }).publicKey
  .export({ format: 'jwk' });
published.kid = 'signing';
published.use = 'sig';
published.alg = 'RS256';

const server = http.createServer();
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  const provider = new Provider(issuer, {
    clients: [{
      client_id: 'cyphonic',
      client_secret: 'a-client-secret-for-tests-only',
      redirect_uris: [redirect],
      response_types: ['code'],
      grant_types: ['authorization_code'],
      token_endpoint_auth_method: 'client_secret_basic',
    }],
    jwks: { keys: [signing] },
    pkce: { required: () => true },
    scopes: ['openid', 'email', 'profile', 'groups'],
    claims: { openid: ['sub'], email: ['email'], profile: ['name'], groups: ['groups'] },
    conformIdTokenClaims: false,
    findAccount: (ctx, id) => ({
      accountId: id,
      claims: () => ({ sub: id, email: `${id}@example.com`, name: id, groups: groups[id] ?? [] }),
    }),
    features: { devInteractions: { enabled: true } },
  });
  provider.proxy = false;
  if (mode === 'forged-keys') {
    // The keys the provider publishes are not the one it signs with.
    provider.use(async (ctx, next) => {
      if (ctx.path === '/jwks') {
        ctx.type = 'application/jwk-set+json';
        ctx.body = { keys: [published] };
        return;
      }
      await next();
    });
  }
  server.on('request', provider.callback());
  console.log(issuer);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => process.exit(0));
}
