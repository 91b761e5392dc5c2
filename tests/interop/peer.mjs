// js-libp2p peer for the interop test: dial a polnet node, ping it, fetch an
// artifact over /polnet/artifact/1.0.0 and print one JSON line with its sha256.
// usage: node peer.mjs <multiaddr with /p2p/> <artifact id>
import { createHash } from 'node:crypto'

// Node 20 lacks Promise.withResolvers, which js-libp2p 3 uses.
if (typeof Promise.withResolvers !== 'function') {
  Promise.withResolvers = function () {
    let resolve, reject
    const promise = new Promise((res, rej) => { resolve = res; reject = rej })
    return { promise, resolve, reject }
  }
}

const { createLibp2p } = await import('libp2p')
const { tcp } = await import('@libp2p/tcp')
const { noise } = await import('@chainsafe/libp2p-noise')
const { yamux } = await import('@chainsafe/libp2p-yamux')
const { ping } = await import('@libp2p/ping')
const { identify } = await import('@libp2p/identify')
const { multiaddr } = await import('@multiformats/multiaddr')
const { byteStream } = await import('@libp2p/utils')

const PROTOCOL = '/polnet/artifact/1.0.0'
const [target, artifactId] = process.argv.slice(2)

function frame (obj) {
  const body = Buffer.from(JSON.stringify(obj))
  const head = Buffer.alloc(4)
  head.writeUInt32BE(body.length)
  return Buffer.concat([head, body])
}

async function readN (bytes, n) {
  return Buffer.from((await bytes.read({ bytes: n })).subarray())
}

async function request (bytes, obj) {
  await bytes.write(frame(obj))
  const len = (await readN(bytes, 4)).readUInt32BE(0)
  const head = JSON.parse((await readN(bytes, len)).toString())
  if (!head.ok) throw new Error(`${head.error}: ${head.message}`)
  return head.size > 0 ? readN(bytes, head.size) : Buffer.alloc(0)
}

const node = await createLibp2p({
  addresses: { listen: ['/ip4/127.0.0.1/tcp/0'] },
  transports: [tcp()],
  connectionEncrypters: [noise()],
  streamMuxers: [yamux()],
  services: { ping: ping(), identify: identify() }
})
const out = {}
try {
  const ma = multiaddr(target)
  const rtt = await node.services.ping.ping(ma)
  out.ping_ms = rtt
  const stream = await node.dialProtocol(ma, PROTOCOL)
  const bytes = byteStream(stream, { maxBufferSize: 8 * 1024 * 1024 })
  const manifest = JSON.parse((await request(bytes, { op: 'manifest', id: artifactId })).toString())
  const hash = createHash('sha256')
  for (let i = 0; i < manifest.chunks.length; i++) {
    const offset = i * manifest.chunk_size
    const length = Math.min(manifest.chunk_size, manifest.size - offset)
    const chunk = await request(bytes, { op: 'read', id: artifactId, offset, length })
    if (createHash('sha256').update(chunk).digest('hex') !== manifest.chunks[i]) {
      throw new Error(`chunk ${i} fails its manifest hash`)
    }
    hash.update(chunk)
  }
  await stream.close()
  out.size = manifest.size
  out.sha256 = hash.digest('hex')
  out.ok = out.sha256 === artifactId
} catch (err) {
  out.ok = false
  out.error = String(err?.stack ?? err)
} finally {
  await node.stop()
}
console.log(JSON.stringify(out))
process.exit(out.ok ? 0 : 1)
